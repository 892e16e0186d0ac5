//! One module per case of the suite. Each takes the shared context, adds
//! its records and comparisons, and notes what it could not run and why.

pub mod clone;
pub mod crossnode;
pub mod delete;
pub mod depth;
pub mod index;
pub mod io;
pub mod node;
pub mod replicated;
pub mod scale;
pub mod snapshot;
