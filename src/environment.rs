//! The environment variables `vse` reads, as `vse --help` lists them (the README's table says
//! more about each; a test keeps the two lists the same).

/// (name, what it sets).
pub const VARS: &[(&str, &str)] = &[
    (
        "VSE_CACHE",
        "cache root (default: root's /var/cache/vse, a user's $XDG_CACHE_HOME/vse, else ~/.cache/vse)",
    ),
    (
        "VSE_GUEST_AGENT",
        "a static guest agent to bake into images instead of the built-in one",
    ),
    (
        "VSE_BUILD_ID_BASE",
        "a root build's sandbox: the first of its 65536 host ids",
    ),
    (
        "VSE_SITE_DIR",
        "the site directory instead of /etc/vse (root only)",
    ),
    (
        "VSE_NODES_SHARE_MACHINE",
        "1: the allocation's nodes are namespaces of one machine",
    ),
    (
        "VSE_STATE_DB",
        "the controller's state database (status, evacuate, launch)",
    ),
    (
        "VSE_LISTEN",
        "vse launch: the front-end's address (as --listen)",
    ),
    (
        "VSE_IMAGE_CACHE",
        "the node-local image cache of vse launch",
    ),
    ("VSE_RUN_DIR", "V2M's run directory: sockets, console logs"),
    ("VSE_AGENT_LOG", "1: node agents log every event"),
];

/// The section `vse --help` ends with.
pub fn help() -> String {
    let mut s = String::from("Environment:\n");
    for (name, what) in VARS {
        s.push_str(&format!("  {name:<24} {what}\n"));
    }
    s
}
