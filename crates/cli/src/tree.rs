//! `lamina snapshot tree`: a volume's snapshots drawn as a tree with
//! box-drawing characters, the live volume under the snapshot it descends
//! from, and the clones made from each snapshot.

use crate::output::{list_or_dash, Table};
use lamina_api::{format_size, CloneState, Snapshot, Volume};
use std::collections::{BTreeMap, HashSet};

/// Marks a snapshot node.
const SNAP: &str = "○";
/// Marks the live volume.
const LIVE: &str = "●";

enum Node<'a> {
    Snap(&'a Snapshot),
    Live,
}

pub fn render(volume: &Volume, snapshots: &[Snapshot]) -> String {
    let by_name: BTreeMap<&str, &Snapshot> =
        snapshots.iter().map(|s| (s.name.as_str(), s)).collect();
    // Children from both directions (parent links and children lists).
    let mut kids: BTreeMap<Option<&str>, Vec<&Snapshot>> = BTreeMap::new();
    for s in snapshots {
        let parent = s.parent.as_deref().filter(|p| by_name.contains_key(p));
        kids.entry(parent).or_default().push(s);
    }
    for list in kids.values_mut() {
        list.sort_by(|a, b| {
            (a.created.as_str(), a.name.as_str()).cmp(&(b.created.as_str(), b.name.as_str()))
        });
        list.dedup_by(|a, b| a.name == b.name);
    }
    let live_parent = volume
        .parent_snapshot
        .as_deref()
        .filter(|p| by_name.contains_key(p));

    let mut title = format!("{} ({}", volume.name, format_size(volume.size));
    if volume.clone_state != CloneState::None {
        let state = format!("{:?}", volume.clone_state).to_lowercase();
        match &volume.origin {
            Some(o) => title.push_str(&format!(
                ", {state} clone of {}/{}",
                o.volume.as_deref().unwrap_or("(deleted)"),
                o.snapshot.as_deref().unwrap_or("(deleted)")
            )),
            None => title.push_str(&format!(", {state} clone")),
        }
    }
    title.push(')');

    let mut table = Table::new(&["SNAPSHOT", "CREATED", "RESTORE SIZE", "EXCLUSIVE", "CLONES"]);
    let mut seen = HashSet::new();
    let roots = children(&kids, None, live_parent.is_none());
    draw(
        &mut table,
        volume,
        &kids,
        live_parent,
        &roots,
        "",
        true,
        &mut seen,
    );
    format!("{title}\n{}", table.render())
}

fn children<'a>(
    kids: &BTreeMap<Option<&str>, Vec<&'a Snapshot>>,
    parent: Option<&str>,
    with_live: bool,
) -> Vec<Node<'a>> {
    let mut v: Vec<Node> = kids
        .get(&parent)
        .map(|l| l.iter().map(|s| Node::Snap(s)).collect())
        .unwrap_or_default();
    if with_live {
        v.push(Node::Live);
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn draw<'a>(
    table: &mut Table,
    volume: &Volume,
    kids: &BTreeMap<Option<&str>, Vec<&'a Snapshot>>,
    live_parent: Option<&str>,
    nodes: &[Node<'a>],
    prefix: &str,
    top: bool,
    seen: &mut HashSet<String>,
) {
    for (i, node) in nodes.iter().enumerate() {
        let last = i + 1 == nodes.len();
        let (branch, indent) = if top {
            ("", "")
        } else if last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        match node {
            Node::Live => table.row(vec![
                format!("{prefix}{branch}{LIVE} (live volume)"),
                "now".into(),
                format_size(volume.size),
                "-".into(),
                "-".into(),
            ]),
            Node::Snap(s) => {
                let mut label = format!("{prefix}{branch}{SNAP} {}", s.name);
                if s.system {
                    label.push_str(" [system]");
                }
                table.row(vec![
                    label,
                    s.created.clone(),
                    format_size(s.restore_size),
                    format_size(s.exclusive_bytes),
                    list_or_dash(&s.clones),
                ]);
                if !seen.insert(s.name.clone()) {
                    continue; // a cycle: never draw a node's subtree twice
                }
                let sub = children(kids, Some(&s.name), live_parent == Some(s.name.as_str()));
                let next = format!("{prefix}{indent}");
                draw(table, volume, kids, live_parent, &sub, &next, false, seen);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(name: &str, parent: Option<&str>, created: &str) -> Snapshot {
        Snapshot {
            id: 2,
            volume_id: 1,
            volume_deleted: false,
            volume: "v".into(),
            name: name.into(),
            created: created.into(),
            parent: parent.map(Into::into),
            children: vec![],
            system: name.starts_with("clone-"),
            labels: Default::default(),
            restore_size: 1 << 30,
            allocated_bytes: 0,
            exclusive_bytes: 4096,
            shared_bytes: 0,
            clones: vec![],
            export: None,
        }
    }

    fn vol(parent: Option<&str>) -> Volume {
        Volume {
            id: 1,
            name: "v".into(),
            size: 2 << 30,
            created: "2025-01-01T00:00:00Z".into(),
            allocated_bytes: 0,
            exclusive_bytes: 0,
            shared_bytes: 0,
            parent_snapshot: parent.map(Into::into),
            origin: None,
            clone_state: CloneState::None,
            export: None,
            operation: None,
            labels: Default::default(),
            replication: None,
        }
    }

    #[test]
    fn draws_a_branching_tree() {
        let mut base = snap("base", None, "2025-01-01T00:00:01Z");
        base.clones = vec!["c1".into(), "c2".into()];
        let snaps = vec![
            base,
            snap("a", Some("base"), "2025-01-01T00:00:02Z"),
            snap("clone-x", Some("a"), "2025-01-01T00:00:03Z"),
            snap("b", Some("base"), "2025-01-01T00:00:04Z"),
        ];
        let out = render(&vol(Some("a")), &snaps);
        // The shape, line by line (column widths depend on the longest label).
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "v (2.0 GiB)");
        assert!(lines[1].ends_with("CLONES"), "{out}");
        assert!(lines[2].starts_with("○ base "), "{out}");
        assert!(lines[2].ends_with(" c1, c2"), "{out}");
        assert!(
            lines[3].starts_with("├── ○ a ") && lines[3].ends_with(" -"),
            "{out}"
        );
        assert!(lines[4].starts_with("│   ├── ○ clone-x [system] "), "{out}");
        assert!(lines[5].starts_with("│   └── ● (live volume) "), "{out}");
        assert!(lines[6].starts_with("└── ○ b "), "{out}");
        assert_eq!(lines.len(), 7, "{out}");
    }

    #[test]
    fn live_volume_alone_without_snapshots() {
        let out = render(&vol(None), &[]);
        assert!(
            out.lines().nth(2).unwrap().starts_with("● (live volume)"),
            "{out}"
        );
    }

    #[test]
    fn live_volume_at_the_top_after_a_parent_was_deleted() {
        let snaps = vec![snap("s", None, "2025-01-01T00:00:01Z")];
        let out = render(&vol(Some("gone")), &snaps);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[2].starts_with("○ s "), "{out}");
        assert!(lines[3].starts_with("● (live volume)"), "{out}");
    }
}
