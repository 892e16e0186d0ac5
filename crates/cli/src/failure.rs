//! What the user sees when a command fails: one `error:` line, then a
//! `hint:` line when there is something to do about it. The daemon's
//! message and hint stay apart, each printed once; a daemon that cannot be
//! reached gets a hint that fits why. The exit status says what kind of
//! failure it was ([`exit_status`]).

use lamina_api::ErrorCode;
use lamina_client::{Client, Error as ClientError, StatusCode, Unreachable};
use std::path::Path;

/// An error of the command itself, with its hint and exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub hint: Option<String>,
    pub exit_code: i32,
}

impl Failure {
    pub fn new(message: impl Into<String>, hint: Option<String>) -> Self {
        Failure {
            message: message.into(),
            hint,
            exit_code: 1,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// How to show `e`: its message (with the context it was given), the
/// hint, and the exit code. `client` is the one the command used, if any.
pub fn explain(e: &anyhow::Error, data_dir: &Path, client: Option<&Client>) -> Failure {
    let message = format!("{e:#}");
    if let Some(f) = e.downcast_ref::<Failure>() {
        return Failure {
            message,
            hint: f.hint.clone(),
            exit_code: f.exit_code,
        };
    }
    let Some(ce) = e.downcast_ref::<ClientError>() else {
        return Failure::new(message, None);
    };
    Failure {
        message,
        hint: client_hint(ce, data_dir, client),
        exit_code: ce.code().map_or(1, exit_status),
    }
}

/// The exit status of a command the daemon refused with `code` (no
/// wildcard: a new code must be given one; docs/daemon.md lists them). 1 is
/// any other failure, 2 also a usage error clap or the CLI finds, 130 an
/// interrupted wait.
pub fn exit_status(code: &ErrorCode) -> i32 {
    match code {
        ErrorCode::Invalid => 2,
        ErrorCode::NotFound => 3,
        ErrorCode::AlreadyExists => 4,
        ErrorCode::Conflict => 5,
        ErrorCode::NoSpace => 6,
        ErrorCode::Unauthorized => 7,
        ErrorCode::Refused => 8,
        ErrorCode::Unavailable => 9,
        ErrorCode::Internal => 10,
        // A code from a newer daemon.
        ErrorCode::Unknown(_) => 1,
    }
}

fn client_hint(e: &ClientError, data_dir: &Path, client: Option<&Client>) -> Option<String> {
    let unix = client.is_none_or(Client::is_unix);
    let dir = data_dir.display();
    match e {
        ClientError::Api { status, .. }
            if *status == StatusCode::UNAUTHORIZED && !client.is_some_and(Client::has_token) =>
        {
            Some(format!(
                "no token was given: pass the daemon's token (the file `token` in its data directory, here {dir}/token) with --token or LAMINA_TOKEN"
            ))
        }
        ClientError::Api { .. } => e.hint().map(String::from),
        ClientError::Unreachable {
            reason: Unreachable::PermissionDenied,
            ..
        } => Some(format!(
            "the socket belongs to the daemon's user: run as root (or as that user), or use --endpoint with the token (`lamina serve --listen ADDR` serves the API on TCP; the token is in {dir}/token)"
        )),
        ClientError::Unreachable { .. } if unix => Some(format!(
            "is the daemon running? start it with `lamina serve --data-dir {dir}`, or point --data-dir or LAMINA_DATA_DIR at the directory it serves"
        )),
        ClientError::Unreachable { .. } => {
            Some("is `lamina serve --listen ADDR` running there, and is the address right?".into())
        }
        ClientError::ConnectionClosed { .. } => Some(
            "the daemon stopped or died during the call: see its log, and `lamina operation list` shows whether the change was made".into(),
        ),
        ClientError::Protocol { .. } => Some(format!(
            "is that a Lamina daemon of this version ({})? its log says more",
            env!("CARGO_PKG_VERSION")
        )),
        ClientError::Endpoint { .. } => Some("give the endpoint as http://HOST:PORT".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable(reason: Unreachable) -> anyhow::Error {
        ClientError::Unreachable {
            target: "/d/api.sock".into(),
            reason,
        }
        .into()
    }

    #[test]
    fn permission_denied_says_what_to_do_instead_of_asking_if_the_daemon_runs() {
        let c = Client::unix("/d/api.sock");
        let f = explain(
            &unreachable(Unreachable::PermissionDenied),
            Path::new("/d"),
            Some(&c),
        );
        assert_eq!(
            f.message,
            "cannot reach the Lamina daemon at /d/api.sock (permission denied)"
        );
        let h = f.hint.unwrap();
        assert!(h.contains("run as root") && h.contains("--endpoint"), "{h}");
        assert!(!h.contains("running?"), "{h}");

        let f = explain(
            &unreachable(Unreachable::NoSocket),
            Path::new("/d"),
            Some(&c),
        );
        assert!(f.hint.unwrap().contains("lamina serve --data-dir /d"));
    }

    #[test]
    fn the_daemons_message_and_hint_are_each_shown_once() {
        let e: anyhow::Error = ClientError::Api {
            status: StatusCode::CONFLICT,
            error: lamina_api::ApiError {
                code: ErrorCode::Conflict,
                message: "volume \"a\" is attached".into(),
                hint: Some("detach it first: lamina volume detach a".into()),
            },
        }
        .into();
        let e = e.context("deleting volume a");
        let f = explain(&e, Path::new("/d"), None);
        assert_eq!(f.message, "deleting volume a: volume \"a\" is attached");
        assert_eq!(
            f.hint.as_deref(),
            Some("detach it first: lamina volume detach a")
        );
        assert_eq!(f.exit_code, 5);
    }

    #[test]
    fn unauthorized_without_a_token_says_so() {
        let e: anyhow::Error = ClientError::Api {
            status: StatusCode::UNAUTHORIZED,
            error: lamina_api::ApiError {
                code: ErrorCode::Unauthorized,
                message: "missing or wrong bearer token".into(),
                hint: Some("pass the token".into()),
            },
        }
        .into();
        let c = Client::tcp("http://h:1", None).unwrap();
        let f = explain(&e, Path::new("/d"), Some(&c));
        assert!(f.hint.unwrap().starts_with("no token was given"));
        let c = Client::tcp("http://h:1", Some("t")).unwrap();
        let f = explain(&e, Path::new("/d"), Some(&c));
        assert_eq!(f.hint.as_deref(), Some("pass the token"));
    }

    /// `Code::InvalidArgument` as the CSI spec writes it: INVALID_ARGUMENT.
    fn grpc_name(c: tonic::Code) -> String {
        let mut out = String::new();
        for (i, ch) in format!("{c:?}").chars().enumerate() {
            if ch.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_uppercase());
        }
        out
    }

    /// Walks every code the daemon answers: each has its row in
    /// docs/daemon.md's table, and the row says the HTTP status, gRPC code
    /// and exit status the code's mappings give. A new code does not
    /// compile until each mapping (an exhaustive match) gives it a value,
    /// and fails here until the table lists it.
    #[test]
    fn every_code_has_its_documented_status_grpc_code_and_exit_status() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/daemon.md"))
                .unwrap();
        let rows: Vec<Vec<&str>> = doc
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        let mut exits = std::collections::HashSet::new();
        for code in ErrorCode::KNOWN {
            let name = format!("`{}`", code.as_str());
            let row = rows
                .iter()
                .find(|r| r[1] == name && r.len() == 7)
                .unwrap_or_else(|| panic!("docs/daemon.md has no row for {name}"));
            assert_eq!(row[2], code.http_status().to_string(), "{name}: HTTP");
            assert_eq!(
                row[3],
                grpc_name(lamina_csi::grpc_code(&code)),
                "{name}: gRPC"
            );
            let exit = exit_status(&code);
            assert_eq!(row[4], exit.to_string(), "{name}: exit status");
            assert!(exits.insert(exit), "{name}: exit status {exit} is taken");
            assert!(![0, 1, 130].contains(&exit), "{name}: exit status {exit}");
        }
        let unknown = ErrorCode::Unknown("newer".into());
        assert_eq!(exit_status(&unknown), 1);
        assert_eq!(lamina_csi::grpc_code(&unknown), tonic::Code::Internal);
    }

    #[test]
    fn failures_keep_their_hint_and_exit_code() {
        let mut f = Failure::new("stopped waiting", Some("follow it".into()));
        f.exit_code = 130;
        let e = anyhow::Error::new(f);
        let shown = explain(&e, Path::new("/d"), None);
        assert_eq!(shown.message, "stopped waiting");
        assert_eq!(shown.hint.as_deref(), Some("follow it"));
        assert_eq!(shown.exit_code, 130);
    }
}
