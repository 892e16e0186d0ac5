//! API paths and query strings, with every name percent-encoded here and
//! nowhere else.

use lamina_api::API_PREFIX;

/// Percent-encode one path segment or query value: everything except
/// ASCII letters, digits and `-_.~`.
pub fn encode(s: &str) -> String {
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

/// `/v1` + `template`, each `{}` in it replaced by the next name, encoded.
/// Names beyond the placeholders are ignored; missing ones leave `{}`
/// (both are programming errors caught by the tests of each route).
pub fn api(template: &str, names: &[&str]) -> String {
    let mut out = String::from(API_PREFIX);
    let mut names = names.iter();
    let mut rest = template;
    while let Some(i) = rest.find("{}") {
        out.push_str(&rest[..i]);
        match names.next() {
            Some(n) => out.push_str(&encode(n)),
            None => out.push_str("{}"),
        }
        rest = &rest[i + 2..];
    }
    out.push_str(rest);
    out
}

/// `path?k=v&...` with the pairs that have a value, values encoded.
pub fn with_query(path: String, pairs: &[(&str, Option<String>)]) -> String {
    let q: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if q.is_empty() {
        path
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode("vol-1.a_b~"), "vol-1.a_b~");
        assert_eq!(encode("a b/c?d&e%"), "a%20b%2Fc%3Fd%26e%25");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn paths_fill_placeholders_in_order() {
        assert_eq!(api("/volumes", &[]), "/v1/volumes");
        assert_eq!(
            api("/volumes/{}/snapshots/{}/revert", &["a/b", "s 1"]),
            "/v1/volumes/a%2Fb/snapshots/s%201/revert"
        );
        assert_eq!(api("/volumes/{}", &[]), "/v1/volumes/{}");
    }

    #[test]
    fn queries_skip_absent_values() {
        assert_eq!(with_query("/p".into(), &[("a", None)]), "/p");
        assert_eq!(
            with_query(
                "/p".into(),
                &[
                    ("a", Some("x y".into())),
                    ("b", None),
                    ("c", Some("1".into()))
                ]
            ),
            "/p?a=x%20y&c=1"
        );
    }
}
