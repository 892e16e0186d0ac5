//! The OpenAPI document against the daemon's answers (issue 38): the rules
//! the daemon checks are in the document with the values of the constants
//! its checks use, each declared bound is driven at and past its limit
//! against a real daemon, and every status those requests get is one the
//! document declares for the operation.

mod support;

use hyper::{Method, StatusCode};
use lamina_api as api;
use lamina_engine as engine;
use serde_json::{json, Value};
use support::Daemon;

/// The document's schema of `schema.field`.
fn field<'a>(doc: &'a Value, schema: &str, field: &str) -> &'a Value {
    let v = &doc["components"]["schemas"][schema]["properties"][field];
    assert!(v.is_object(), "{schema}.{field} is not in the document");
    v
}

/// The schema of query parameter `name` of `GET path`.
fn param<'a>(doc: &'a Value, path: &str, name: &str) -> &'a Value {
    doc["paths"][path]["get"]["parameters"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path} has no parameters"))
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| &p["schema"])
        .unwrap_or_else(|| panic!("GET {path} has no parameter {name}"))
}

fn uint(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Send a request and check that its status is one the document declares
/// for the operation (`template` is the document's path); the status and
/// the body.
fn call(
    d: &Daemon,
    doc: &Value,
    method: Method,
    template: &str,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let text = body.map(Value::to_string);
    let (s, v) = d.call(method.clone(), path, text.as_deref());
    let op = &doc["paths"][template][method.as_str().to_lowercase()];
    assert!(op.is_object(), "{method} {template} is not in the document");
    assert!(
        op["responses"]
            .as_object()
            .unwrap()
            .contains_key(s.as_str()),
        "{method} {path} answered {s}, which the document does not declare: {v}"
    );
    (s, v)
}

/// `call`, and the status must be `want`.
#[track_caller]
fn expect(
    d: &Daemon,
    doc: &Value,
    method: Method,
    template: &str,
    path: &str,
    body: Option<&Value>,
    want: StatusCode,
) -> Value {
    let (s, v) = call(d, doc, method.clone(), template, path, body);
    assert_eq!(s, want, "{method} {path} {body:?}: {v}");
    v
}

#[test]
fn the_document_states_the_rules_with_the_constants_the_checks_use() {
    let d = Daemon::start();
    let doc = d.ok(Method::GET, "/openapi.json", None);
    let names = [
        field(&doc, "CreateVolume", "name"),
        field(&doc, "CreateSnapshot", "name"),
        field(&doc, "CreateSnapshotGroup", "name"),
        field(&doc, "CreateClone", "name"),
        field(&doc, "CreateClone", "from_volume"),
        &field(&doc, "CreateSnapshotGroup", "volumes")["items"],
        &field(&doc, "ScheduleSpec", "volumes")["items"],
    ];
    for n in names {
        assert_eq!(n["pattern"], engine::NAME_PATTERN, "{n}");
        assert_eq!(uint(n, "minLength"), 1, "{n}");
        assert_eq!(uint(n, "maxLength"), engine::NAME_MAX_LEN as u64, "{n}");
    }
    // A schedule's name leaves room for its snapshots' "-YYYYMMDD-HHMM"
    // (the daemon's schedules::api::MAX_NAME; driven at and past it below).
    let s = field(&doc, "ScheduleSpec", "name");
    assert_eq!(s["pattern"], engine::NAME_PATTERN);
    assert_eq!(uint(s, "maxLength"), 63);
    for schema in ["CreateVolume", "ExpandVolume"] {
        let size = field(&doc, schema, "size");
        assert_eq!(uint(size, "minimum"), engine::SECTOR, "{schema}: {size}");
        assert_eq!(uint(size, "multipleOf"), engine::SECTOR, "{schema}: {size}");
        assert_eq!(
            uint(size, "maximum"),
            engine::MAX_VOLUME_SIZE,
            "{schema}: {size}"
        );
    }
    for schema in [
        "CreateVolume",
        "SetLabels",
        "CreateSnapshot",
        "CreateSnapshotGroup",
        "ScheduleSpec",
    ] {
        let l = field(&doc, schema, "labels");
        let (k, v) = (&l["propertyNames"], &l["additionalProperties"]);
        assert_eq!(uint(k, "minLength"), 1, "{schema}: {l}");
        assert_eq!(
            uint(k, "maxLength"),
            engine::LABEL_KEY_MAX_LEN as u64,
            "{schema}: {l}"
        );
        assert_eq!(
            uint(v, "maxLength"),
            engine::LABEL_VALUE_MAX_LEN as u64,
            "{schema}: {l}"
        );
        assert_eq!(k["pattern"], engine::LABEL_PATTERN, "{schema}: {l}");
        assert_eq!(v["pattern"], engine::LABEL_PATTERN, "{schema}: {l}");
        assert_eq!(
            uint(l, "maxProperties"),
            (engine::LABELS_MAX_BYTES / (1 + engine::LABEL_OVERHEAD)) as u64,
            "{schema}: {l}"
        );
    }
    for (path, name, max) in [
        ("/v1/operations", "limit", api::MAX_OPERATIONS_LIMIT as u64),
        ("/v1/changes", "wait_ms", api::MAX_CHANGES_WAIT_MS),
        ("/v1/changes", "after", api::MAX_QUERY_ID),
        ("/v1/snapshots", "id", api::MAX_QUERY_ID),
    ] {
        let p = param(&doc, path, name);
        assert_eq!(uint(p, "maximum"), max, "{path} {name}: {p}");
        // What the declared format holds.
        let fits = match p["format"].as_str() {
            Some("int32") => i32::MAX as u64,
            Some("int64") => i64::MAX as u64,
            other => panic!("{path} {name}: format {other:?}"),
        };
        assert!(max <= fits, "{path} {name}: {p}");
    }
    let o = &doc["paths"]["/v1/snapshots"]["get"]["responses"];
    assert!(o["404"].is_object(), "{o}");
    // Every snapshot path names its volume as a reference: NAME or NAME@ID.
    let mut seen = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/volumes/{name}/snapshots") {
            continue;
        }
        for (verb, op) in item.as_object().unwrap() {
            let p = op["parameters"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == "name"))
                .unwrap_or_else(|| panic!("{verb} {path} has no name parameter"));
            assert_eq!(
                p["schema"]["pattern"],
                engine::VOLUME_REFERENCE_PATTERN,
                "{verb} {path}"
            );
            assert!(
                p["description"].as_str().unwrap_or("").contains("NAME@ID"),
                "{verb} {path}: {p}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 6, "{seen} snapshot operations");
}

#[test]
fn the_name_pattern_is_the_naming_rule() {
    let re = regex::Regex::new(engine::NAME_PATTERN).unwrap();
    let agree = |n: &str| {
        let by_doc = re.is_match(n) && n.len() <= engine::NAME_MAX_LEN;
        assert_eq!(
            by_doc,
            engine::check_name(n).is_ok(),
            "{n:?}: the pattern and check_name disagree"
        );
    };
    for n in [
        "", "a", "0", "-a", ".a", "_a", "a-b.c_d", "A", "a b", "a/b", "a\n", "é", "a@b",
    ] {
        agree(n);
    }
    agree(&"a".repeat(engine::NAME_MAX_LEN));
    agree(&"a".repeat(engine::NAME_MAX_LEN + 1));
    // Every two-byte name over the printable ASCII range and beyond.
    for a in 0u8..=0x7f {
        for b in 0u8..=0x7f {
            agree(std::str::from_utf8(&[a, b]).unwrap());
        }
    }
    let refs = regex::Regex::new(engine::VOLUME_REFERENCE_PATTERN).unwrap();
    for r in [
        "a",
        "a@1",
        "a@0",
        "a@",
        "@1",
        "a@1@2",
        "a@x",
        "a@-1",
        "A@1",
        "a@01",
        "a@18446744073709551615",
        "a@18446744073709551616",
    ] {
        let by_doc = refs.is_match(r) && r.split('@').next().unwrap().len() <= engine::NAME_MAX_LEN;
        // The pattern cannot bound the id: u64's range is the check's alone.
        let in_range = r
            .split_once('@')
            .is_none_or(|(_, id)| id.parse::<u64>().is_ok());
        assert_eq!(
            by_doc && in_range,
            engine::check_volume_reference(r).is_ok(),
            "{r:?}: the pattern and check_volume_reference disagree"
        );
    }
    let labels = regex::Regex::new(engine::LABEL_PATTERN).unwrap();
    for c in (0u32..0x300).filter_map(char::from_u32) {
        let s = c.to_string();
        assert_eq!(
            labels.is_match(&s),
            engine::check_labels(&[(s.clone(), "v".into())]).is_ok(),
            "{c:?}: the label pattern and check_labels disagree"
        );
    }
}

#[test]
fn requests_at_and_past_each_declared_bound_get_the_declared_answers() {
    let d = Daemon::start();
    let doc = d.ok(Method::GET, "/openapi.json", None);
    let (ok, bad) = (StatusCode::OK, StatusCode::BAD_REQUEST);

    // Query parameters: at the declared maximum answered, past it refused.
    for (path, name, extra) in [
        ("/v1/operations", "limit", ""),
        ("/v1/changes", "wait_ms", ""),
        ("/v1/changes", "after", "&wait_ms=0"),
        ("/v1/snapshots", "id", ""),
    ] {
        let max = uint(param(&doc, path, name), "maximum");
        for (v, want) in [
            (max.to_string(), ok),
            ((max as u128 + 1).to_string(), bad),
            (u64::MAX.to_string(), bad),
            ((u64::MAX as u128 + 1).to_string(), bad),
            ("-1".to_string(), bad),
        ] {
            let q = format!("{path}?{name}={v}{extra}");
            expect(&d, &doc, Method::GET, path, &q, None, want);
        }
    }
    // The fuzzer's cases, literally.
    let q = "/v1/operations?limit=2147483648";
    expect(&d, &doc, Method::GET, "/v1/operations", q, None, bad);
    let q = "/v1/changes?wait_ms=300001";
    expect(&d, &doc, Method::GET, "/v1/changes", q, None, bad);
    let q = "/v1/snapshots?schedule=NOSUCH";
    let e = expect(
        &d,
        &doc,
        Method::GET,
        "/v1/snapshots",
        q,
        None,
        StatusCode::NOT_FOUND,
    );
    assert_eq!(e["code"], "not_found", "{e}");

    // Names: the longest declared is taken, one more is refused, and so
    // is one the pattern does not match.
    let max = uint(field(&doc, "CreateVolume", "name"), "maxLength") as usize;
    let created = StatusCode::CREATED;
    let vol = |name: &str, size: u64| json!({"name": name, "size": size});
    let post_volume = |b: &Value, want| {
        expect(
            &d,
            &doc,
            Method::POST,
            "/v1/volumes",
            "/v1/volumes",
            Some(b),
            want,
        )
    };
    post_volume(&vol(&"v".repeat(max), 1 << 20), created);
    post_volume(&vol(&"w".repeat(max + 1), 1 << 20), bad);
    post_volume(&vol("Upper", 1 << 20), bad);
    post_volume(&vol("", 1 << 20), bad);

    // Sizes: minimum, maximum and multipleOf as declared.
    let size = field(&doc, "CreateVolume", "size");
    let (min, max, step) = (
        uint(size, "minimum"),
        uint(size, "maximum"),
        uint(size, "multipleOf"),
    );
    post_volume(&vol("smallest", min), created);
    post_volume(&vol("largest", max), created);
    post_volume(&vol("below", min - 1), bad);
    post_volume(&vol("above", max + step), bad);
    post_volume(&vol("uneven", min + step / 2), bad);
    post_volume(&vol("zero", 0), bad);

    // Labels: key and value lengths at and past their declared maxima,
    // a control character, more labels than the declared count.
    let l = field(&doc, "SetLabels", "labels");
    let kmax = uint(&l["propertyNames"], "maxLength") as usize;
    let vmax = uint(&l["additionalProperties"], "maxLength") as usize;
    let count = uint(l, "maxProperties") as usize;
    let put = |labels: Value, want| {
        expect(
            &d,
            &doc,
            Method::PUT,
            "/v1/volumes/{name}/labels",
            "/v1/volumes/smallest/labels",
            Some(&json!({ "labels": labels })),
            want,
        )
    };
    put(json!({ "k".repeat(kmax): "v" }), ok);
    put(json!({ "k".repeat(kmax + 1): "v" }), bad);
    put(json!({ "k": "v".repeat(vmax) }), ok);
    put(json!({ "k": "v".repeat(vmax + 1) }), bad);
    put(json!({ "k": "a\u{7}b" }), bad);
    put(json!({ "": "v" }), bad);
    let many: serde_json::Map<String, Value> =
        (0..=count).map(|i| (format!("{i}"), json!(""))).collect();
    put(Value::Object(many), bad);
    let snap = |labels: Value, want| {
        expect(
            &d,
            &doc,
            Method::POST,
            "/v1/volumes/{name}/snapshots",
            "/v1/volumes/smallest/snapshots",
            Some(&json!({ "name": "s", "labels": labels })),
            want,
        )
    };
    snap(json!({ "k".repeat(kmax + 1): "v" }), bad);
    snap(json!({ "k".repeat(kmax): "v" }), created);

    // A schedule's name: its own maximum.
    let max = uint(field(&doc, "ScheduleSpec", "name"), "maxLength") as usize;
    let schedule = |name: String, want| {
        let b = json!({"name": name, "cron": "0 * * * *", "keep_last": 3, "volumes": ["smallest"]});
        expect(
            &d,
            &doc,
            Method::POST,
            "/v1/schedules",
            "/v1/schedules",
            Some(&b),
            want,
        )
    };
    schedule("h".repeat(max), created);
    schedule("i".repeat(max + 1), bad);
}
