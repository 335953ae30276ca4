//! Progress reporting: the library emits events, the CLI draws them (indicatif or lines).

/// A build step, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    Fetch,
    Unpack,
    Configure,
    Customize,
    Initramfs,
    RootDisk,
    Extras,
    /// `vse import`: reading the source and checking its digests.
    Verify,
    /// `vse import`: unpacking the image's layers.
    Layers,
    /// Keeping a freshly configured root as a layer for later builds.
    SaveLayer,
    /// The SHA256 of every part, and the manifest.
    Manifest,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Fetch => "fetching packages",
            Phase::Unpack => "unpacking packages",
            Phase::Configure => "configuring (maintainer scripts)",
            Phase::Customize => "applying spec and policy",
            Phase::Initramfs => "generating initramfs",
            Phase::RootDisk => "writing root disk",
            Phase::Extras => "writing extra formats",
            Phase::Verify => "reading and verifying the image",
            Phase::Layers => "unpacking image layers",
            Phase::SaveLayer => "keeping the configured root as a layer",
            Phase::Manifest => "hashing the image and writing its manifest",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Event {
    Phase(Phase),
    FetchStart {
        files: usize,
        bytes: u64,
    },
    FetchFile {
        name: String,
        bytes: u64,
        cached: bool,
    },
    FetchDone,
    Unpacked {
        name: String,
    },
    /// A line of output from a maintainer script or post-install command.
    ScriptOutput(String),
}

pub trait Progress: Sync {
    fn event(&self, ev: Event);
}

/// Seconds one build spent in a phase, from its event to the next phase's (or the end).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhaseTime {
    pub phase: Phase,
    pub seconds: f64,
}

/// Forwards every event and times the phases on the way: where a build's time went, for its
/// report (never for the image, whose bytes must not depend on how the build went).
pub struct PhaseClock<'a> {
    inner: &'a dyn Progress,
    state: std::sync::Mutex<Clocked>,
}

/// The phase running and when it started; the phases done, in order.
#[derive(Default)]
struct Clocked {
    running: Option<(Phase, std::time::Instant)>,
    done: Vec<PhaseTime>,
}

impl Clocked {
    /// Closes the running phase (a phase entered twice counts once, summed).
    fn close(&mut self) {
        let Some((phase, since)) = self.running.take() else {
            return;
        };
        let seconds = since.elapsed().as_secs_f64();
        match self.done.iter_mut().find(|t| t.phase == phase) {
            Some(t) => t.seconds += seconds,
            None => self.done.push(PhaseTime { phase, seconds }),
        }
    }
}

impl<'a> PhaseClock<'a> {
    pub fn new(inner: &'a dyn Progress) -> Self {
        PhaseClock {
            inner,
            state: std::sync::Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Clocked> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The phases in the order they first ran, the last one closed now.
    pub fn finish(&self) -> Vec<PhaseTime> {
        let mut st = self.state();
        st.close();
        std::mem::take(&mut st.done)
    }
}

impl Progress for PhaseClock<'_> {
    fn event(&self, ev: Event) {
        if let Event::Phase(p) = &ev {
            let mut st = self.state();
            st.close();
            st.running = Some((*p, std::time::Instant::now()));
        }
        self.inner.event(ev);
    }
}

/// Discards everything (tests, `--quiet`).
pub struct Silent;

impl Progress for Silent {
    fn event(&self, _ev: Event) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_timed_in_order_and_a_repeated_one_is_summed() {
        let clock = PhaseClock::new(&Silent);
        for p in [Phase::Fetch, Phase::Unpack, Phase::Fetch, Phase::RootDisk] {
            clock.event(Event::Phase(p));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        clock.event(Event::FetchDone);
        let t = clock.finish();
        let phases: Vec<Phase> = t.iter().map(|t| t.phase).collect();
        assert_eq!(phases, [Phase::Fetch, Phase::Unpack, Phase::RootDisk]);
        assert!(t[0].seconds >= 0.009, "{t:?}");
        assert!(t.iter().all(|t| t.seconds >= 0.004), "{t:?}");
        assert!(clock.finish().is_empty());
    }
}
