//! Job topology: the k-ary boot tree and the binomial-graph (BMG) overlay with routing tables.

mod bmg;
mod tree;

pub use bmg::{Bmg, RoutingTable};
pub use tree::Tree;
