// Package kubeletreg is the client side of the kubelet plugin registration
// protocol: what kubelet does with a registrar's socket, so that csisupd
// can discover CSI drivers deployed for Kubernetes the same way.
//
// # The protocol
//
// A CSI driver deployed for Kubernetes runs a registrar next to it (usually
// the node-driver-registrar sidecar). The registrar serves the
// pluginregistration.v1 Registration service on a unix socket named
// <driver>-reg.sock in kubelet's plugin registration directory
// (plugins_registry). Kubelet watches that directory; for each new socket it
//
//  1. calls GetInfo, which answers the plugin type (CSIPlugin), the driver
//     name, the endpoint of the driver's CSI socket and the CSI versions the
//     driver speaks;
//  2. validates the answer: a handler must exist for the type, and the CSI
//     handler wants at least one supported CSI version (1.x);
//  3. answers NotifyRegistrationStatus: registered, or not with the reason.
//
// A registrar told that registration failed logs the reason and exits, so
// that its container restarts and registration is tried again from the
// start. A registrar that stops removes its socket, which is how kubelet
// learns that the driver is gone.
//
// GetInfo and Notify make the two calls; Check is step 2 with csisupd's
// rules, and its error is the reason to send back. The behaviour follows
// kubelet v1.37 (the API of k8s.io/kubelet v0.37.2). Versions are parsed
// as kubelet parses them (see Check); the driver name must moreover be a
// csisupd plugin id, since csisupd knows the driver by it.
//
// # Bounds
//
// A registrar is outside csisupd's control: every call is bounded by its
// context (DefaultTimeout when the context has no deadline) and every
// reply by MaxReplySize, so one that never answers or answers with a huge
// message costs one call's wait and nothing more.
package kubeletreg
