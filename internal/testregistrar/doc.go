// Package testregistrar is a test double of Kubernetes' node-driver-registrar
// sidecar (kubernetes-csi/node-driver-registrar v2.13, the registration
// server it runs for kubelet): the other end of package kubeletreg.
//
// A Registrar serves the pluginregistration.v1 Registration service on
// <Config.Dir>/<Config.Driver>-reg.sock, the socket a driver's registrar puts
// in kubelet's plugin registration directory. As the sidecar does, Start
// first removes whatever stale file is at that path, and the socket is
// made accessible to its owner only. GetInfo answers
//
//	{type: CSIPlugin, name: <Driver>, endpoint: <Endpoint>, supported_versions: ["1.0.0"]}
//
// where Endpoint is the sidecar's --kubelet-registration-path, the driver's
// CSI socket as kubelet sees it. Config.Type and Config.Versions override the
// type and versions, so a test can stand up a registrar for another plugin
// type or with versions csisupd does not speak; the Endpoint is sent as
// given, empty or relative included.
//
// Every NotifyRegistrationStatus is recorded: WaitStatus waits for the n-th
// one with the caller's deadline and Statuses lists them all. The package
// itself never exits on a failed registration, as the sidecar does: a test
// decides what happens next. The command in cmd/csi-testregistrar behaves
// as the sidecar process, exiting 1 when registration fails. Stop stops
// serving, bounded, and removes the socket, as the sidecar does on SIGTERM.
package testregistrar
