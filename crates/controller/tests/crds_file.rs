//! The chart ships the CRDs as a file (deploy/helm/lamina/crds/lamina.io.yaml,
//! and deploy/kubernetes/01-crds.yaml copied from it by deploy/validate): it
//! must be exactly what the Rust types generate, or an operator would install
//! a schema the controller does not speak.

#[test]
fn the_charts_crds_are_the_ones_the_types_generate() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/helm/lamina/crds/lamina.io.yaml"
    );
    let file = std::fs::read_to_string(path).expect("reading the chart's CRD file");
    // the file opens with comment lines saying where it comes from
    let body: String = file
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let generated = lamina_controller::crds_yaml().expect("rendering the CRDs");
    assert!(body == generated, "{path} is stale: run deploy/crds-update");
    assert!(
        generated.contains("name: volumes.lamina.io")
            && generated.contains("name: snapshots.lamina.io")
            && generated.contains("name: snapshotschedules.lamina.io")
    );
}
