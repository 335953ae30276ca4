//! `vse sign IMAGE --key KEY`: sign an image's manifest for sites whose policy requires
//! images signed by their build service (`images.signed_by`).

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
#[command(
    after_help = "The signature covers manifest.json, which records the SHA256 of every
part; a launch under `images.signed_by` checks both. Example:
  vse sign /srv/images/lammps --key /etc/vse-build/signing.key.asc"
)]
pub struct SignArgs {
    /// An image directory written by `vse build` or `vse import`.
    pub image: PathBuf,
    /// Armored OpenPGP secret key without a passphrase.
    #[arg(long)]
    pub key: PathBuf,
}

pub fn run(a: SignArgs) -> Result<ExitCode> {
    let audit = super::audit::auditor(&[])?;
    let mut entry = vse_audit::Entry::allowed(vse_audit::Action::Sign).detail(format!(
        "{} with {}",
        a.image.display(),
        a.key.display()
    ));
    let opened =
        vse_image::ImageDir::open(&a.image).map_err(|e| crate::exit::invalid(e.to_string()));
    if opened.is_ok() {
        entry.image = vse_audit::image_digest(&a.image);
    }
    super::audit::record(&audit, entry, opened)?;
    let sig = vsec::admit::sign(&a.image, &a.key)?;
    println!("signed {}", sig.display());
    Ok(ExitCode::SUCCESS)
}
