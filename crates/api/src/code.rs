//! The stable error codes of [`crate::ApiError`]: one enum for every crate
//! that produces or reads them, written as snake_case text on the wire.

use std::borrow::Cow;
use std::fmt;

/// What kind of refusal an API error is. The daemon answers only the known
/// codes; a client keeps a code it does not know (from a newer daemon) as
/// [`ErrorCode::Unknown`] rather than failing to read the answer.
///
/// Each known code has one HTTP status ([`ErrorCode::http_status`]); the
/// CSI driver maps each to one gRPC code and the CLI to one exit status,
/// every mapping an exhaustive `match`, and docs/daemon.md lists all three.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is malformed or breaks a rule (`400`).
    Invalid,
    /// What it names does not exist (`404`).
    NotFound,
    /// A resource of that name exists with another spec (`409`).
    AlreadyExists,
    /// The request conflicts with the current state (`409`).
    Conflict,
    /// The pool is full (`507`).
    NoSpace,
    /// A missing or wrong bearer token (`401`).
    Unauthorized,
    /// Another node refused this one's credentials, or this one its
    /// (`403`).
    Refused,
    /// The daemon cannot serve the request now: its pool or store is
    /// latched, or another node cannot be reached (`503`).
    Unavailable,
    /// The daemon failed (`500`); its log says more.
    Internal,
    /// A code this build does not know, as the daemon wrote it.
    Unknown(String),
}

impl ErrorCode {
    /// Every code the daemon answers, in the order docs/daemon.md lists
    /// them.
    pub const KNOWN: [ErrorCode; 9] = [
        ErrorCode::Invalid,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::Conflict,
        ErrorCode::NoSpace,
        ErrorCode::Unauthorized,
        ErrorCode::Refused,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// As written on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::Invalid => "invalid",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::Conflict => "conflict",
            ErrorCode::NoSpace => "no_space",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Refused => "refused",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::Unknown(s) => s,
        }
    }

    /// The code written as `s`; text no known code has is kept as
    /// [`ErrorCode::Unknown`].
    pub fn parse(s: &str) -> ErrorCode {
        ErrorCode::KNOWN
            .into_iter()
            .find(|c| c.as_str() == s)
            .unwrap_or_else(|| ErrorCode::Unknown(s.to_string()))
    }

    /// The HTTP status the daemon answers with this code. An unknown code
    /// is never answered; a client treats it as a failure of the daemon.
    pub fn http_status(&self) -> u16 {
        match self {
            ErrorCode::Invalid => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists => 409,
            ErrorCode::Conflict => 409,
            ErrorCode::NoSpace => 507,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Refused => 403,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal | ErrorCode::Unknown(_) => 500,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        Ok(ErrorCode::parse(&s))
    }
}

impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorCode::KNOWN.iter().map(|c| c.as_str().to_string())))
            .description(Some(
                "The error's stable code (docs/daemon.md lists each with its HTTP status); a client takes a code it does not know as an error of the daemon",
            ))
            .into()
    }
}

impl utoipa::ToSchema for ErrorCode {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk over every variant: each is named here (no wildcard), so a
    /// new one does not compile until it is placed in `KNOWN` or handled.
    fn in_known(c: &ErrorCode) -> bool {
        match c {
            ErrorCode::Invalid
            | ErrorCode::NotFound
            | ErrorCode::AlreadyExists
            | ErrorCode::Conflict
            | ErrorCode::NoSpace
            | ErrorCode::Unauthorized
            | ErrorCode::Refused
            | ErrorCode::Unavailable
            | ErrorCode::Internal => true,
            ErrorCode::Unknown(_) => false,
        }
    }

    #[test]
    fn every_code_reads_back_as_itself_and_unknown_text_is_kept() {
        for c in ErrorCode::KNOWN {
            assert!(in_known(&c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), c);
            let s = c.as_str();
            assert!(
                s.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'),
                "{s} is not snake_case"
            );
        }
        let newer: ErrorCode = serde_json::from_str("\"too_late\"").unwrap();
        assert_eq!(newer, ErrorCode::Unknown("too_late".into()));
        assert!(!in_known(&newer));
        assert_eq!(serde_json::to_string(&newer).unwrap(), "\"too_late\"");
        let e: crate::ApiError =
            serde_json::from_str(r#"{"code":"too_late","message":"m","hint":null}"#).unwrap();
        assert_eq!(e.code, newer);
    }
}
