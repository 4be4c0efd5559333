package kubeletreg

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/ids"
)

// Check reports why kubelet's CSI handler, with csisupd's rules, would
// refuse the registration info describes, or nil when it would accept it.
// The error's text is meant to be sent back to the registrar as the reason
// (Notify) and shown to operators, so it stands alone; text that came from
// the registrar is quoted and clipped.
//
// The rules: Type is CSIPlugin; Name is a valid csisupd plugin id
// (ids.PluginIDPattern); Endpoint passes EndpointPath; and
// SupportedVersions holds at least one CSI 1.x version, parsed as kubelet
// parses them: an optional "v", two or more dot-separated numbers, the
// first without leading zeros, then anything ("1.0.0", "v1.2", "1.0.0-rc1").
// Kubelet takes the highest listed version below 2 and wants it to be 1.x,
// which is the same as wanting any 1.x version.
func Check(info Info) error {
	if info.Type != registerapi.CSIPlugin {
		return fmt.Errorf("unsupported plugin type %q: csisupd supervises %s only", clip(info.Type), registerapi.CSIPlugin)
	}
	if info.Name == "" {
		return errors.New("plugin name is empty: csisupd needs it as the plugin id")
	}
	if !ids.ValidPluginID(info.Name) {
		return fmt.Errorf("plugin name %q is not a valid csisupd plugin id: it must match %s", clip(info.Name), ids.PluginIDPattern)
	}
	if _, err := EndpointPath(info.Endpoint); err != nil {
		return err
	}
	for _, v := range info.SupportedVersions {
		if major, ok := versionMajor(v); ok && major == 1 {
			return nil
		}
	}
	if len(info.SupportedVersions) == 0 {
		return errors.New("no supported versions listed: csisupd speaks CSI 1.x")
	}
	return fmt.Errorf("no supported version in %s: csisupd speaks CSI 1.x", clipList(info.SupportedVersions))
}

// unixScheme is the prefix kubelet accepts in front of an endpoint path.
const unixScheme = "unix://"

// EndpointPath returns the socket path of a registrar's endpoint, which
// kubelet accepts both as a path and as a unix:// URL: the path with the
// prefix stripped. It fails, with a reason fit to send back to the
// registrar, when the endpoint is empty, not absolute, or too long to
// dial (see csiclient.CheckSocketPath).
func EndpointPath(endpoint string) (string, error) {
	p := strings.TrimPrefix(endpoint, unixScheme)
	switch {
	case endpoint == "":
		return "", errors.New("endpoint is empty: a CSI plugin must name its socket")
	case p == "":
		return "", fmt.Errorf("endpoint %q names no path", endpoint)
	case !path.IsAbs(p):
		return "", fmt.Errorf("endpoint %q is not an absolute path (nor %s and one)", clip(endpoint), unixScheme)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("endpoint %q contains a NUL byte", clip(endpoint))
	}
	if err := csiclient.CheckSocketPath(p); err != nil {
		return "", fmt.Errorf("endpoint cannot be dialled: %w", err)
	}
	return p, nil
}

// versionMajor parses v as kubelet's generic version parser does and
// returns its major number; ok is false when v is not a version.
func versionMajor(v string) (major uint64, ok bool) {
	s := strings.TrimLeft(v, " \t\n\v\f\r")
	s = strings.TrimPrefix(s, "v")
	// The numeric part: digits, then any ".digits". What follows it is
	// not interpreted.
	var parts []string
	for {
		n := leadingDigits(s)
		if n == 0 {
			break
		}
		parts = append(parts, s[:n])
		s = s[n:]
		if len(s) < 2 || s[0] != '.' || leadingDigits(s[1:]) == 0 {
			break
		}
		s = s[1:]
	}
	if len(parts) < 2 {
		return 0, false
	}
	if len(parts[0]) > 1 && parts[0][0] == '0' {
		return 0, false
	}
	for _, p := range parts {
		if _, err := strconv.ParseUint(p, 10, 64); err != nil {
			return 0, false
		}
	}
	major, _ = strconv.ParseUint(parts[0], 10, 64)
	return major, true
}

// leadingDigits returns how many ASCII digits s starts with.
func leadingDigits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// Clipping keeps a hostile registrar's strings from flooding the reason we
// send back and the operators' logs.
const (
	clipLen      = 160
	clipEntries  = 8
	clipVersions = 32
)

// clip shortens s to clipLen bytes, marking the cut.
func clip(s string) string { return clipTo(s, clipLen) }

func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// clipList formats versions as a quoted list of at most clipEntries
// entries, each clipped.
func clipList(versions []string) string {
	shown := versions[:min(len(versions), clipEntries)]
	quoted := make([]string, len(shown))
	for i, v := range shown {
		quoted[i] = strconv.Quote(clipTo(v, clipVersions))
	}
	s := "[" + strings.Join(quoted, " ")
	if more := len(versions) - len(shown); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s + "]"
}
