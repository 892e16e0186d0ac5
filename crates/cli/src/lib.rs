//! The library half of the `lamina` command: the API client, shared with the
//! benchmark suite so both speak to the daemon the same way. The command's
//! parsing and printing stay in the binary.

pub mod client;
