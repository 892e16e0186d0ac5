//! The background jobs of operations: a full clone's copy (`copy`), a
//! pull from another node (`pull`), the watch of a flatten (`flatten`).
//! Each runs on a thread of its own at background priority
//! (`State::spawn_job`), records its durable progress, and ends its
//! operation through `State::transition`, the one writer of its record.
//! At shutdown each stops at its next step and leaves its operation
//! running, for the next start to resume. The copying itself is the
//! engine's (and lamina-transfer's); jobs schedule, record and report.

pub mod copy;
pub mod flatten;
pub mod pull;
