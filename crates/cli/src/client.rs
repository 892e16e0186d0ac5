//! A small HTTP/1.1 client for the daemon's API: one request per
//! connection, over the daemon's unix socket (no token needed: the socket's
//! permissions guard it) or over TCP with the bearer token.

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use lamina_api::ApiError;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncWrite};

/// An error to show the user: a message and, when there is something to
/// do about it, a hint. `main` prints them as `error:` and `hint:` lines.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub hint: Option<String>,
}

impl Failure {
    pub fn new(message: impl Into<String>, hint: Option<String>) -> Self {
        Failure {
            message: message.into(),
            hint,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure {
            message: e.message,
            hint: e.hint,
        }
    }
}

/// How to reach the daemon.
#[derive(Clone, Debug)]
pub enum Transport {
    Unix {
        socket: PathBuf,
        data_dir: PathBuf,
    },
    Tcp {
        /// The endpoint as given, for messages.
        endpoint: String,
        host: String,
        port: u16,
        /// Path prefix of the endpoint (usually empty).
        base: String,
        token: Option<String>,
    },
}

#[derive(Clone, Debug)]
pub struct Client {
    transport: Transport,
}

/// A successful answer: its status and its JSON body (`Null` when empty).
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Client {
    /// The client for the global options: the unix socket of `data_dir`
    /// unless an endpoint is given; then TCP with `token`, or the token
    /// read from `data_dir/token` when none is given and that is readable.
    pub fn new(data_dir: &Path, endpoint: Option<&str>, token: Option<&str>) -> Result<Client> {
        let layout = lamina_server::Layout::new(data_dir);
        let transport = match endpoint {
            None => Transport::Unix {
                socket: layout.api_socket,
                data_dir: data_dir.to_path_buf(),
            },
            Some(ep) => {
                let (host, port, base) = parse_endpoint(ep)?;
                let token = match token {
                    Some(t) => Some(t.trim().to_string()),
                    None => std::fs::read_to_string(&layout.token)
                        .ok()
                        .map(|t| t.trim().to_string()),
                };
                Transport::Tcp {
                    endpoint: ep.to_string(),
                    host,
                    port,
                    base,
                    token,
                }
            }
        };
        Ok(Client { transport })
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        Ok(self.call(Method::GET, path, None).await?.body)
    }

    pub async fn post(&self, path: &str, body: Option<Value>) -> Result<Answer> {
        self.call(Method::POST, path, body).await
    }

    pub async fn delete(&self, path: &str) -> Result<Answer> {
        self.call(Method::DELETE, path, None).await
    }

    /// Send one request; a non-2xx answer becomes a [`Failure`] with the
    /// API's message and hint.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Answer> {
        let (status, bytes) = self.send(method, path, body).await?;
        let parsed: Option<Value> = if bytes.is_empty() {
            None
        } else {
            serde_json::from_slice(&bytes).ok()
        };
        if !status.is_success() {
            if let Some(e) = parsed
                .clone()
                .and_then(|v| serde_json::from_value::<ApiError>(v).ok())
            {
                let mut f = Failure::from(e);
                if status == StatusCode::UNAUTHORIZED {
                    if let Transport::Tcp { token: None, .. } = &self.transport {
                        f.message.push_str(" (no token was given)");
                    }
                }
                return Err(f.into());
            }
            let text = String::from_utf8_lossy(&bytes);
            bail!(Failure::new(
                format!("the daemon answered {status}: {}", text.trim()),
                None
            ));
        }
        if !bytes.is_empty() && parsed.is_none() {
            bail!(
                "the daemon answered {status} with a body that is not JSON: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        Ok(Answer {
            status,
            body: parsed.unwrap_or(Value::Null),
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Bytes)> {
        let payload = match &body {
            Some(v) => Bytes::from(serde_json::to_vec(v)?),
            None => Bytes::new(),
        };
        let mut req = Request::builder().method(method);
        match &self.transport {
            Transport::Unix { socket, .. } => {
                req = req.uri(path).header(hyper::header::HOST, "localhost");
                let req = finish(req, body.is_some(), payload)?;
                let stream = tokio::net::UnixStream::connect(socket)
                    .await
                    .map_err(|e| self.unreachable(&e))?;
                exchange(stream, req).await
            }
            Transport::Tcp {
                host,
                port,
                base,
                token,
                ..
            } => {
                let authority = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                req = req
                    .uri(format!("{base}{path}"))
                    .header(hyper::header::HOST, authority);
                if let Some(t) = token {
                    req = req.header(lamina_api::AUTH_HEADER, format!("Bearer {t}"));
                }
                let req = finish(req, body.is_some(), payload)?;
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| self.unreachable(&e))?;
                exchange(stream, req).await
            }
        }
    }

    fn unreachable(&self, e: &std::io::Error) -> anyhow::Error {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no socket there".to_string(),
            std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
            _ => e.to_string(),
        };
        match &self.transport {
            Transport::Unix { socket, data_dir } => Failure::new(
                format!(
                    "cannot reach the Lamina daemon at {} ({reason}; is `lamina serve` running? start it with `lamina serve --data-dir {}`)",
                    socket.display(),
                    data_dir.display()
                ),
                None,
            )
            .into(),
            Transport::Tcp { endpoint, .. } => Failure::new(
                format!(
                    "cannot reach the Lamina daemon at {endpoint} ({reason}; is `lamina serve --listen ADDR` running there?)"
                ),
                None,
            )
            .into(),
        }
    }
}

fn finish(
    req: hyper::http::request::Builder,
    json: bool,
    payload: Bytes,
) -> Result<Request<Full<Bytes>>> {
    let req = if json {
        req.header(hyper::header::CONTENT_TYPE, "application/json")
    } else {
        req
    };
    req.body(Full::new(payload)).context("building the request")
}

async fn exchange<S>(stream: S, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("talking to the daemon")?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let resp = sender
        .send_request(req)
        .await
        .context("talking to the daemon")?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .context("reading the daemon's answer")?
        .to_bytes();
    driver.abort();
    Ok((status, bytes))
}

/// `http://HOST:PORT[/BASE]` or `HOST:PORT` into host, port and path prefix.
fn parse_endpoint(ep: &str) -> Result<(String, u16, String)> {
    let rest = if let Some(r) = ep.strip_prefix("http://") {
        r
    } else if ep.starts_with("https://") {
        bail!(Failure::new(
            format!("endpoint {ep:?}: https is not supported"),
            Some(
                "use http://HOST:PORT (put a TLS proxy in front of the daemon for remote access)"
                    .into()
            )
        ));
    } else if ep.contains("://") {
        bail!(Failure::new(
            format!("endpoint {ep:?}: only http:// endpoints are supported"),
            None
        ));
    } else {
        ep
    };
    let (hostport, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
        None => (rest, String::new()),
    };
    let bad = || {
        anyhow!(Failure::new(
            format!("endpoint {ep:?} is not http://HOST:PORT"),
            None
        ))
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, p) = h.split_once(']').ok_or_else(bad)?;
        (h.to_string(), p.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad())?,
        None => 80,
    };
    Ok((host, port, base))
}

/// Percent-encode one path segment.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:7480").unwrap(),
            ("127.0.0.1".into(), 7480, "".into())
        );
        assert_eq!(
            parse_endpoint("localhost:80/x/").unwrap(),
            ("localhost".into(), 80, "/x".into())
        );
        assert_eq!(
            parse_endpoint("http://[::1]:9").unwrap(),
            ("::1".into(), 9, "".into())
        );
        assert_eq!(
            parse_endpoint("http://h").unwrap(),
            ("h".into(), 80, "".into())
        );
        assert!(parse_endpoint("https://h:1").is_err());
        assert!(parse_endpoint("http://h:x").is_err());
        assert!(parse_endpoint("http://:1").is_err());
    }

    #[test]
    fn segments() {
        assert_eq!(seg("vol-1.a_b"), "vol-1.a_b");
        assert_eq!(seg("a b/c"), "a%20b%2Fc");
    }
}
