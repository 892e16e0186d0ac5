//! Lamina against the real thing: the `scenarios` test (tests/scenarios)
//! starts kube-env (a kube-apiserver, kube-controller-manager, Kubernetes'
//! snapshot-controller and CSI sidecars on loopback, driving `lamina serve`
//! through `lamina csi`), runs the standard snapshot API's scenarios against
//! it through kubectl, and reads the data back through Lamina's NBD exports.
//!
//! This crate owns only those scenarios. It starts and stops the environment
//! with kube-env/up and kube-env/down (and, for the scenarios whose node
//! side is the chart's pods, makes the image with deploy/image/build), and
//! must not change how the driver, the daemon or the chart behave; the
//! library is empty on purpose (a package needs a target besides its
//! tests).
