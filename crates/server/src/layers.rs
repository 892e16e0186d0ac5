//! The crate's modules and their imports (docs/daemon.md, "Inside the
//! daemon"): every module sits in a layer, imports only modules of its
//! layer or below, and no two import each other, directly or around a
//! cycle, but the pair listed as one concept. Reads each module's source
//! up to its tests and takes every `crate::` path in it (and `super::` in
//! a module's own files) as an import. A `mod` declaration is not one: a
//! module's files are its parts, and sit in its layer or above.

use std::collections::{BTreeMap, BTreeSet};

/// The layers, lowest first: a module imports only from its own layer and
/// those before it. A web view or replica operations would be callers
/// beside the schedules' runner, below HTTP.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "background",
            "config",
            "error",
            "metrics",
            "pacing",
            "paths",
            "shared",
        ],
    ),
    (
        "store",
        &[
            "migrate",
            "store",
            "store/db",
            "store/nodes",
            "store/records",
            "store/replicas",
        ],
    ),
    (
        "beside the state",
        &[
            "changes",
            "device",
            "files",
            "front",
            "front/rebuild",
            "holders",
            "replicas",
            "schedules",
            "schedules/records",
        ],
    ),
    // The operations' records move in `state/ledger` only.
    (
        "state",
        &[
            "state",
            "state/exports",
            "state/ledger",
            "state/nodes",
            "state/views",
        ],
    ),
    ("jobs", &["jobs", "jobs/copy", "jobs/flatten", "jobs/pull"]),
    (
        "operations",
        &[
            "operations",
            "operations/clones",
            "operations/exports",
            "operations/groups",
            "operations/recover",
            "operations/remote",
            "operations/replicas",
            "operations/snapshots",
            "operations/volumes",
            "freeze",
        ],
    ),
    ("callers of operations", &["prune", "schedules/runner"]),
    (
        "HTTP",
        &[
            "extract",
            "groups",
            "handlers",
            "nodes",
            "openapi",
            "router",
            "schedules/api",
            "space",
        ],
    ),
];

/// Cycles that stay: modules that are one concept. A migration is the
/// store's reading of its own older formats: `migrate` builds the store's
/// record types, and the store runs it when it opens an older file.
const ONE_CONCEPT: [&[&str]; 1] = [&["migrate", "store"]];

/// Module name (`schedules/api`) to its code before its tests.
fn sources() -> BTreeMap<String, String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let rel = p.strip_prefix(&root).unwrap().to_str().unwrap();
            let Some(name) = rel.strip_suffix(".rs") else {
                continue;
            };
            let name = name.strip_suffix("/mod").unwrap_or(name).to_string();
            // The crate root, this test, and files of tests only.
            if name == "lib" || name == "layers" || name.ends_with("/tests") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_string();
            sources.insert(name, code);
        }
    }
    sources
}

/// The paths a `use` item or a path in code names, from just after
/// `crate::` or `super::`: `a::B`, or each item of `a::{b::C, d}`.
fn paths(rest: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let head = &rest[..rest.find(|c| !ident(c)).unwrap_or(rest.len())];
    let prefix: Vec<String> = head
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let tail = &rest[head.len()..];
    match tail
        .strip_prefix('{')
        .filter(|_| head.is_empty() || head.ends_with("::"))
    {
        Some(g) => g[..g.find('}').unwrap_or(g.len())]
            .split(',')
            .map(|item| {
                let mut p = prefix.clone();
                p.extend(item.trim().split("::").map(String::from));
                p
            })
            .collect(),
        None => vec![prefix],
    }
}

/// Module name to the modules its code names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let sources = sources();
    let names: BTreeSet<String> = sources.keys().cloned().collect();
    let resolve = |path: &[String]| -> Option<String> {
        let first = path.first()?;
        let two = path.iter().take(2).cloned().collect::<Vec<_>>().join("/");
        [two, first.clone()].into_iter().find(|n| names.contains(n))
    };
    let mut graph = BTreeMap::new();
    for (m, code) in &sources {
        let mut deps = BTreeSet::new();
        for (prefix, base) in [
            ("crate::", None),
            ("super::", m.split_once('/').map(|p| p.0)),
        ] {
            if prefix == "super::" && base.is_none() {
                continue;
            }
            for (i, _) in code.match_indices(prefix) {
                for mut path in paths(&code[i + prefix.len()..]) {
                    if let Some(b) = base {
                        path.insert(0, b.to_string());
                    }
                    if let Some(d) = resolve(&path) {
                        deps.insert(d);
                    }
                }
            }
        }
        deps.remove(m);
        graph.insert(m.clone(), deps);
    }
    graph
}

/// The strongly connected components of more than one module.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for d in &g[&n] {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let all: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|k| (k, reach(k))).collect();
    g.keys()
        .map(|a| {
            g.keys()
                .filter(|b| *b == a || (all[a].contains(*b) && all[*b].contains(a)))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() > 1)
        .collect()
}

#[test]
fn the_reader_finds_imports() {
    assert_eq!(
        paths("a::{b::C, d}; x"),
        vec![vec!["a", "b", "C"], vec!["a", "d"]]
    );
    assert_eq!(paths("{a, b::c}"), vec![vec!["a"], vec!["b", "c"]]);
    assert_eq!(paths("a::b::C;"), vec![vec!["a", "b", "C"]]);
    let g = imports();
    assert!(
        g["router"].contains("handlers") && g["groups"].contains("operations/groups"),
        "the reader lost imports: {g:#?}"
    );
}

#[test]
fn module_cycles() {
    let g = imports();
    let found = cycles(&g);
    let allowed: BTreeSet<Vec<String>> = ONE_CONCEPT
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(found, allowed, "import cycles between modules: {g:#?}");
}

#[test]
fn layers_only_call_down() {
    let g = imports();
    let rank: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i)))
        .collect();
    let unplaced: Vec<&String> = g
        .keys()
        .filter(|m| !rank.contains_key(m.as_str()))
        .collect();
    assert!(unplaced.is_empty(), "modules in no layer: {unplaced:?}");
    let gone: Vec<&&str> = rank.keys().filter(|m| !g.contains_key(**m)).collect();
    assert!(
        gone.is_empty(),
        "layers name modules that are gone: {gone:?}"
    );
    let mut up = Vec::new();
    for (m, deps) in &g {
        for d in deps {
            if rank[d.as_str()] > rank[m.as_str()] {
                up.push(format!(
                    "{m} ({}) imports {d} ({})",
                    LAYERS[rank[m.as_str()]].0,
                    LAYERS[rank[d.as_str()]].0
                ));
            }
        }
    }
    assert!(up.is_empty(), "imports of a higher layer: {up:#?}");
}

/// An operation's record is written by `State::transition` only
/// (`state/ledger`): no other module calls the store's writers of it.
#[test]
fn only_the_ledger_writes_operation_records() {
    let writers: Vec<String> = sources()
        .into_iter()
        .filter(|(m, code)| {
            m != "store"
                && m != "state/ledger"
                && (code.contains(".put_op(") || code.contains(".put_op_end("))
        })
        .map(|(m, _)| m)
        .collect();
    assert!(writers.is_empty(), "{writers:?} write operation records");
    assert!(sources()["state/ledger"].contains(".put_op_end("));
}
