//! Getting bytes to the daemon and back: HTTP/1.1, one request per
//! connection, over the daemon's unix socket (its file permissions guard
//! it: no token) or over TCP with the bearer token.

use crate::error::{Error, Result, Unreachable};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncWrite};

/// A TCP endpoint: `http://HOST:PORT[/PREFIX]` (or `HOST:PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// As given, for messages.
    pub text: String,
    pub host: String,
    pub port: u16,
    /// Path prefix in front of `/v1` (empty unless behind a proxy).
    pub prefix: String,
}

impl Endpoint {
    /// Parse `http://HOST:PORT[/PREFIX]`, `HOST:PORT` or `http://[V6]:PORT`;
    /// the port defaults to 80. https is refused: the daemon speaks plain
    /// HTTP, and a TLS proxy belongs in front of it.
    pub fn parse(text: &str) -> Result<Endpoint> {
        let bad = |reason: &str| Error::Endpoint {
            endpoint: text.to_string(),
            reason: reason.to_string(),
        };
        let rest = if let Some(r) = text.strip_prefix("http://") {
            r
        } else if text.starts_with("https://") {
            return Err(bad("https is not supported; use http://HOST:PORT and put a TLS proxy in front of the daemon for remote access"));
        } else if text.contains("://") {
            return Err(bad("only http:// endpoints are supported"));
        } else {
            text
        };
        let (hostport, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let not_host_port = "is not http://HOST:PORT";
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h.split_once(']').ok_or_else(|| bad(not_host_port))?;
            (h, p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad(not_host_port));
        }
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| bad(not_host_port))?,
            None => 80,
        };
        Ok(Endpoint {
            text: text.to_string(),
            host: host.to_string(),
            port,
            prefix: prefix.to_string(),
        })
    }

    /// The `Host` header: the host, bracketed if IPv6, and the port.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Where the daemon is.
#[derive(Clone)]
pub enum Target {
    Unix(PathBuf),
    Tcp {
        endpoint: Endpoint,
        token: Option<String>,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => f.debug_tuple("Unix").field(p).finish(),
            // Never the token itself: Debug output ends up in logs.
            Target::Tcp { endpoint, token } => f
                .debug_struct("Tcp")
                .field("endpoint", &endpoint.text)
                .field("token", &token.as_ref().map(|_| "<set>"))
                .finish(),
        }
    }
}

impl Target {
    /// The socket path or the endpoint, as messages name it.
    pub fn describe(&self) -> String {
        match self {
            Target::Unix(p) => p.display().to_string(),
            Target::Tcp { endpoint, .. } => endpoint.text.clone(),
        }
    }

    /// Send one request (a JSON body if `json` is given); the status and
    /// the whole body of the answer.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        json: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes)> {
        let mut req = Request::builder().method(method);
        if json.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let body = Full::new(Bytes::from(json.unwrap_or_default()));
        let unreachable = |e: std::io::Error| Error::Unreachable {
            target: self.describe(),
            reason: Unreachable::from_io(&e),
        };
        match self {
            Target::Unix(socket) => {
                let req = req
                    .uri(path)
                    .header(hyper::header::HOST, "localhost")
                    .body(body)
                    .map_err(|e| self.protocol(None, format!("building the request: {e}")))?;
                let stream = tokio::net::UnixStream::connect(socket)
                    .await
                    .map_err(unreachable)?;
                self.exchange(stream, req).await
            }
            Target::Tcp { endpoint, token } => {
                req = req
                    .uri(format!("{}{path}", endpoint.prefix))
                    .header(hyper::header::HOST, endpoint.authority());
                if let Some(t) = token {
                    req = req.header(lamina_api::AUTH_HEADER, format!("Bearer {t}"));
                }
                let req = req
                    .body(body)
                    .map_err(|e| self.protocol(None, format!("building the request: {e}")))?;
                let stream =
                    tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
                        .await
                        .map_err(unreachable)?;
                self.exchange(stream, req).await
            }
        }
    }

    pub fn protocol(&self, status: Option<StatusCode>, detail: String) -> Error {
        Error::Protocol {
            target: self.describe(),
            status,
            detail,
        }
    }

    /// A failed exchange: [`Error::ConnectionClosed`] when the connection
    /// ended before the answer did (the daemon stopped or died mid-call),
    /// else a protocol error.
    fn failed(&self, status: Option<StatusCode>, doing: &str, e: &hyper::Error) -> Error {
        // hyper's own text ("connection closed before message completed")
        // and what it has from the system, if anything.
        let mut detail = format!("{doing}: {e}");
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            detail.push_str(&format!(": {s}"));
            source = s.source();
        }
        if connection_lost(e) {
            Error::ConnectionClosed {
                target: self.describe(),
                detail,
            }
        } else {
            self.protocol(status, detail)
        }
    }

    async fn exchange<S>(&self, stream: S, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.protocol(None, format!("HTTP handshake: {e}")))?;
        // The connection is driven beside the request; it ends with it.
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let result = async {
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| self.failed(None, "sending the request", &e))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| self.failed(Some(status), "reading the answer", &e))?
                .to_bytes();
            Ok((status, bytes))
        }
        .await;
        driver.abort();
        result
    }
}

/// Whether a failed exchange is the connection ending early: closed before
/// the answer (or its body) was complete, reset by the peer, or the request
/// dropped because the connection was gone.
fn connection_lost(e: &hyper::Error) -> bool {
    use std::io::ErrorKind as K;
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
            );
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> (String, u16, String) {
        let e = Endpoint::parse(s).unwrap();
        (e.host, e.port, e.prefix)
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            ep("http://127.0.0.1:7480"),
            ("127.0.0.1".into(), 7480, "".into())
        );
        assert_eq!(ep("localhost:80/x/"), ("localhost".into(), 80, "/x".into()));
        assert_eq!(ep("http://[::1]:9"), ("::1".into(), 9, "".into()));
        assert_eq!(ep("http://h"), ("h".into(), 80, "".into()));
        assert_eq!(
            Endpoint::parse("http://[::1]:9").unwrap().authority(),
            "[::1]:9"
        );
        for bad in [
            "https://h:1",
            "ftp://h:1",
            "http://h:x",
            "http://:1",
            "http://[::1:9",
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(
                matches!(&e, Error::Endpoint { endpoint, .. } if endpoint == bad),
                "{bad}: {e}"
            );
        }
        assert!(Endpoint::parse("https://h:1")
            .unwrap_err()
            .to_string()
            .contains("TLS proxy"));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let t = Target::Tcp {
            endpoint: Endpoint::parse("h:1").unwrap(),
            token: Some("secret-token".into()),
        };
        let d = format!("{t:?}");
        assert!(!d.contains("secret-token") && d.contains("<set>"), "{d}");
    }

    /// A peer on a real unix socket that reads the request, answers
    /// `answer` and closes; the client's error.
    async fn answered_by(answer: &'static [u8]) -> Error {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let peer = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await.unwrap() {
                    0 => break,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
            s.write_all(answer).await.unwrap();
            // Dropped: the connection closes.
        });
        let e = Target::Unix(path)
            .send(Method::GET, "/v1/health", None)
            .await
            .unwrap_err();
        peer.await.unwrap();
        e
    }

    #[tokio::test]
    async fn a_connection_closed_before_the_answer_is_told_apart() {
        for answer in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial\":",
        ] {
            let e = answered_by(answer).await;
            assert!(
                matches!(&e, Error::ConnectionClosed { .. }) && e.is_unavailable(),
                "{e:?}"
            );
            assert!(e.to_string().contains("may or may not"), "{e}");
        }
        // An answer that is no HTTP is the daemon's fault, not a lost one.
        let e = answered_by(b"SSH-2.0-nope\r\n\r\n").await;
        assert!(matches!(&e, Error::Protocol { .. }), "{e:?}");
        assert!(!e.is_unavailable());
    }

    #[tokio::test]
    async fn a_missing_socket_is_unreachable_with_its_path() {
        let dir = std::env::temp_dir().join(format!("lamina-client-{}", std::process::id()));
        let t = Target::Unix(dir.join("api.sock"));
        let e = t.send(Method::GET, "/v1/health", None).await.unwrap_err();
        match &e {
            Error::Unreachable { target, reason } => {
                assert_eq!(target, &dir.join("api.sock").display().to_string());
                assert_eq!(reason, &Unreachable::NoSocket);
            }
            other => panic!("{other:?}"),
        }
    }
}
