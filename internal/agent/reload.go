package agent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/config"
)

// Reload applies the parts of a new configuration that can change while
// running:
//
//   - log_level;
//   - enable_debug (/debug/pprof/ and, with ACLs off, the Agent API's
//     Profile follow it from then on);
//   - client.probe_interval, client.probe_timeout and
//     client.fingerprint_interval;
//   - the consul block except consul.enabled;
//   - client.max_event_subscribers and
//     client.max_event_subscribers_per_connection (for streams opened from
//     then on);
//   - the declaration keys of plugin blocks (socket, type, required,
//     health_timeout): only the plugins whose declaration changed are
//     touched;
//   - the plugins' secrets files (secrets_file), each read again even
//     when its path did not change: a file that cannot be used keeps the
//     secrets read before, and fails the reload naming it; a removed file
//     or key drops them.
//
// Every other key is compared with the running value, and each one that
// changed is logged by name at warn level as taking effect only after a
// restart; it keeps its running value, so the next reload names it again
// until the agent restarts.
//
// The certificate files are read again (rotation without a restart): new
// connections on every port use the new certificates, open ones keep
// theirs; a file that cannot be used keeps the previous certificates and
// fails the reload naming the file. A change to the tls block itself (a
// file path, a verify_* key, or TLS turned on or off) is refused: TLS
// stays as the agent started with it, and Reload returns (and logs at
// error level) an error saying so, since an operator who changed a path
// must not believe the API now uses it.
//
// Reload logs every problem itself; the returned error joins them for the
// caller to act on.
func (a *Agent) Reload(next *config.Config) error {
	a.notifyReloading()
	defer a.notify(daemon.SdNotifyReady)
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.cfg
	want := *next
	// Directories the agent chose at start (dev mode creates temporary
	// ones) stay: a dev configuration that names none leaves them empty.
	if want.Dev && want.DataDir == "" {
		want.DataDir = prev.DataDir
	}
	if want.Dev && want.Client.PluginDir == "" {
		want.Client.PluginDir = prev.Client.PluginDir
	}

	// applied is the running configuration with every live change made.
	applied := *prev
	var errs []error
	var failed []string // keys whose live change failed; reported by errs
	fail := func(err error, keys ...string) {
		a.log.Error("reload: " + err.Error())
		errs = append(errs, err)
		failed = append(failed, keys...)
	}

	a.log.SetLevel(hclog.LevelFromString(want.LogLevel))
	applied.LogLevel = want.LogLevel
	a.debug.Store(want.EnableDebug)
	applied.EnableDebug = want.EnableDebug

	// The parts' hooks, in the order New set them up: certificates, probe
	// timing, the consul block, the event stream caps.
	for _, p := range a.parts {
		if p.reload == nil {
			continue
		}
		if keys, err := p.reload(&want, &applied); err != nil {
			fail(err, keys...)
		}
	}

	// What still differs was not applied.
	pending := changedKeys(&applied, &want)
	var restart, tls []string
	for _, key := range pending {
		switch {
		case hasPrefix(key, failed):
			// Reported with its error above.
		case strings.HasPrefix(key, "tls."):
			tls = append(tls, key)
		default:
			restart = append(restart, key)
		}
	}
	if len(restart) > 0 {
		verb := "takes"
		if len(restart) > 1 {
			verb = "take"
		}
		a.log.Warn(fmt.Sprintf("reload: %s changed but %s effect only after a restart", strings.Join(restart, ", "), verb))
	}
	if len(tls) > 0 {
		err := fmt.Errorf("tls: changing %s by reload is not supported; TLS stays as it was (%s); restart the agent to change it",
			strings.Join(tls, ", "), describeTLS(prev.TLS))
		a.log.Error("reload: " + err.Error())
		errs = append(errs, err)
	}
	a.cfg = &applied

	fields := []any{"log_level", applied.LogLevel, "probe_interval", applied.Client.ProbeInterval,
		"probe_timeout", applied.Client.ProbeTimeout}
	if len(pending) > 0 || len(errs) > 0 {
		// Not "configuration reloaded": the operator must not read that
		// everything took effect.
		a.log.Warn("configuration partly reloaded; the lines above say what did not change",
			append(fields, "not_applied", strings.Join(pending, ", "))...)
	} else {
		a.log.Info("configuration reloaded", fields...)
	}
	return errors.Join(errs...)
}

// describeTLS says what TLS the API serves with t.
func describeTLS(t config.TLSConfig) string {
	if !t.Enabled() {
		return "off: the gRPC API serves plain text"
	}
	s := "on, cert " + t.CertFile
	if t.CAFile != "" {
		s += ", client CA " + t.CAFile
	}
	return s
}

// hasPrefix reports whether key starts with one of prefixes ("consul."
// names the whole block, "client.probe_timeout" one key).
func hasPrefix(key string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// changedKeys returns the configuration keys ("name", "client.rpc_timeout")
// whose values differ between a and b, in the order of Config.String.
//
// It compares the String renderings, the one place that lists every key
// with its value: a key added to the configuration is compared here (and,
// unless Reload learns to apply it, reported as needing a restart) without
// a change to this file. The Consul token renders redacted, so a change of
// one token to another is not seen; the token is applied live with the
// rest of the consul block.
func changedKeys(a, b *config.Config) []string {
	keysA, valuesA := configValues(a)
	keysB, valuesB := configValues(b)
	var out []string
	for _, k := range keysA {
		if valuesA[k] != valuesB[k] {
			out = append(out, k)
		}
	}
	// Keys only b has: a plugin block added.
	for _, k := range keysB {
		if _, ok := valuesA[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// configValues parses Config.String: "key = value" lines at the top level
// and in "block {" ... "}" sections. Values are HCL literals, quoted with
// strconv.Quote, so none spans lines.
func configValues(c *config.Config) (keys []string, values map[string]string) {
	values = make(map[string]string)
	block := ""
	for _, line := range strings.Split(c.String(), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasSuffix(line, "{"):
			block = strings.TrimSpace(strings.TrimSuffix(line, "{")) + "."
		case line == "}":
			block = ""
		default:
			if k, v, ok := strings.Cut(line, " = "); ok {
				keys = append(keys, block+k)
				values[block+k] = v
			}
		}
	}
	return keys, values
}
