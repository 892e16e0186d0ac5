//! The crate's modules and their imports: no cycle but the ones listed
//! (docs/daemon.md, "Inside the daemon"). Reads each module's source up to
//! its tests and takes every `crate::` path in it as an import.

use std::collections::{BTreeMap, BTreeSet};

/// Cycles that stay: two modules that are one concept each.
const ONE_CONCEPT: [&[&str]; 2] = [&["handlers", "openapi"], &["migrate", "store"]];

/// The cycle still to cut (docs/daemon.md): listed, so that a new one fails.
const TO_CUT: &[&str] = &[
    "apply", "changes", "extract", "groups", "jobs", "remote", "state",
];

/// Module name (`schedules/api`) to the modules its code names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
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
            if name == "lib" || name == "layers" {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_string();
            sources.insert(name, code);
        }
    }
    let names: BTreeSet<String> = sources.keys().cloned().collect();
    let resolve = |path: &[&str]| -> Option<String> {
        let two = path.iter().take(2).copied().collect::<Vec<_>>().join("/");
        [two, path[0].to_string()]
            .into_iter()
            .find(|n| names.contains(n))
    };
    let mut graph = BTreeMap::new();
    for (m, code) in &sources {
        let mut deps = BTreeSet::new();
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
        for (prefix, base) in [
            ("crate::", None),
            ("super::", m.split_once('/').map(|p| p.0)),
        ] {
            if prefix == "super::" && base.is_none() {
                continue;
            }
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                // `use crate::{a::B, c}`: each item of the group.
                let items: Vec<&str> = if let Some(g) = rest.strip_prefix('{') {
                    g[..g.find('}').unwrap_or(g.len())].split(',').collect()
                } else {
                    vec![&rest[..rest.find(|c| !ident(c)).unwrap_or(rest.len())]]
                };
                for item in items {
                    let mut path: Vec<&str> = item.trim().split("::").collect();
                    if let Some(b) = base {
                        path.insert(0, b);
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
fn module_cycles() {
    let g = imports();
    assert!(
        g["handlers"].contains("apply"),
        "the reader lost imports: {g:?}"
    );
    let found = cycles(&g);
    let allowed: BTreeSet<Vec<String>> = ONE_CONCEPT
        .iter()
        .copied()
        .chain([TO_CUT])
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(found, allowed, "import cycles between modules: {g:#?}");
}
