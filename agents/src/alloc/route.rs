//! Which of this machine's addresses the nodes can reach: the source address the kernel's
//! routing table picks for packets to a node. That is the front-end's listen address when
//! nothing names one (a batch job's front-end runs on a login or head node whose address on
//! the compute network is not known in advance).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Why no address of this machine was found for reaching a node.
#[derive(Debug, thiserror::Error)]
#[error(
    "no route from this machine to node address {to}: {source}; hint: give the front-end's address on the nodes' network (--listen IP or VSE_LISTEN)"
)]
pub struct NoRoute {
    pub to: IpAddr,
    #[source]
    pub source: std::io::Error,
}

/// An unroutable node is an allocation (or a site network) problem, not a vse bug.
impl vse_exit::Classify for NoRoute {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// The local address packets to `to` leave from. A connected UDP socket asks the kernel's
/// route lookup and sends nothing, so no packet reaches `to`.
pub fn source_address_to(to: IpAddr) -> Result<IpAddr, NoRoute> {
    let err = |source| NoRoute { to, source };
    let any: IpAddr = match to {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind(SocketAddr::new(any, 0)).map_err(err)?;
    // Port 9 (discard): any port does; connect() only fixes the destination.
    sock.connect(SocketAddr::new(to, 9)).map_err(err)?;
    let ip = sock.local_addr().map_err(err)?.ip();
    if ip.is_unspecified() {
        return Err(err(std::io::Error::other(
            "the kernel chose no source address",
        )));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_reached_from_loopback() {
        let lo: IpAddr = Ipv4Addr::new(127, 0, 0, 7).into();
        assert!(source_address_to(lo).unwrap().is_loopback());
    }

    #[test]
    fn an_unroutable_address_is_refused_with_a_hint() {
        // The IPv4 broadcast address cannot be connected to without SO_BROADCAST.
        let e = source_address_to(Ipv4Addr::BROADCAST.into()).unwrap_err();
        assert!(e.to_string().contains("--listen IP or VSE_LISTEN"), "{e}");
    }
}
