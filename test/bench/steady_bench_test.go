package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testutil"
)

// steadyPlugins is the size of the steady-state measurement.
const steadyPlugins = 1000

// steadyWindow is how long the agent's CPU time is measured once every
// plugin is healthy: six probe rounds at the production 5 s interval.
const steadyWindow = 30 * time.Second

// BenchmarkSteadyState1000 runs the real csisupd agent binary against 1,000
// plugins served by a separate csi-testplugin process, with production probe
// settings, and reports the agent's CPU (percent of one core) and resident
// memory once all plugins are healthy. The plugins' own CPU is not counted.
// It runs the agent four times, twice with telemetry.prometheus_metrics =
// false and twice with metrics on and /metrics scraped every metricsScrapeInterval (the
// scrape interval of Prometheus' example configuration), so the cost of the metrics is reported
// beside the figure without them. Then it runs the agent, without metrics,
// over an empty plugin directory: empty_agent_cpu_%core and
// empty_agent_rss_MiB are its floor (binary, runtime, servers, loops), and
// nometrics_rss_growth_MiB and nometrics_cpu_growth/direct_cpu what the
// 1,000 plugins add over it. Beside all, it reports the direct path
// measured on the same plugins right after: the same probe loop over full
// grpc-go connections, whose figures are growth of this process too.
func BenchmarkSteadyState1000(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 1,000 plugins and measures for 30 s")
	}
	dir := testutil.TempDir(b)
	bin := buildBinaries(b, dir)
	pluginDir := filepath.Join(dir, "plugins")

	plugins := exec.Command(filepath.Join(bin, "csi-testplugin"),
		"--dir", pluginDir, "--count", strconv.Itoa(steadyPlugins), "--state-dir", filepath.Join(dir, "state"))
	waitForLine(b, plugins, "csi-testplugin: serving")
	defer stopProcess(plugins)

	// Off, on, on, off (an ABBA order): what drifts during the run (the
	// plugins' process warming up, the machine) weighs on both alike.
	var offCPU, offRSS, cpu, rss float64
	for i, metrics := range []bool{false, true, true, false} {
		c, r := runSteadyAgent(b, bin, filepath.Join(dir, fmt.Sprintf("run%d", i)), pluginDir, steadyPlugins, metrics)
		if metrics {
			cpu, rss = cpu+c/2, rss+r/2
		} else {
			offCPU, offRSS = offCPU+c/2, offRSS+r/2
		}
	}
	b.ReportMetric(cpu, "cpu_%core")
	b.ReportMetric(rss, "rss_MiB")
	b.ReportMetric(offCPU, "nometrics_cpu_%core")
	b.ReportMetric(offRSS, "nometrics_rss_MiB")
	b.ReportMetric(cpu/offCPU, "metrics_cpu/nometrics_cpu")
	b.ReportMetric(rss-offRSS, "metrics_extra_rss_MiB")

	// The agent's own floor: the same agent, without metrics, over an
	// empty plugin directory (the binary, the runtime, its servers and
	// loops). What the 1,000 plugins add over it is what compares with
	// the direct path's growth below.
	emptyDir := filepath.Join(dir, "no-plugins")
	if err := os.MkdirAll(emptyDir, 0o700); err != nil {
		b.Fatal(err)
	}
	emptyCPU, emptyRSS := runSteadyAgent(b, bin, filepath.Join(dir, "empty"), emptyDir, 0, false)
	b.ReportMetric(emptyCPU, "empty_agent_cpu_%core")
	b.ReportMetric(emptyRSS, "empty_agent_rss_MiB")
	b.ReportMetric(offRSS-emptyRSS, "nometrics_rss_growth_MiB")

	// The direct path, on the same plugins in the same run: the same
	// probe loop (heartbeat.Monitor, same interval and timeout) over a
	// full grpc-go connection per plugin, as a supervisor without the
	// supervision connection would probe. This process's own CPU is
	// measured.
	direct, directRSS := measureDirectSteadyState(b, pluginDir)
	b.ReportMetric(direct, "direct_cpu_%core")
	b.ReportMetric(cpu/direct, "cpu/direct_cpu")
	b.ReportMetric(directRSS, "direct_rss_growth_MiB")
	b.ReportMetric((offCPU-emptyCPU)/direct, "nometrics_cpu_growth/direct_cpu")
}

// metricsScrapeInterval is how often the steady-state benchmark scrapes
// /metrics while it measures.
const metricsScrapeInterval = 15 * time.Second

// runSteadyAgent runs the agent against pluginDir with a data dir under
// dir until its plugins (n of them) are healthy, then measures its CPU (percent of one
// core) over steadyWindow and its RSS (MiB). With metrics, /metrics is
// scraped every metricsScrapeInterval during the window and must hold
// the probe histograms; without, telemetry.prometheus_metrics is false.
func runSteadyAgent(b *testing.B, bin, dir, pluginDir string, n int, metrics bool) (cpuPercent, rssMiB float64) {
	b.Helper()
	ports := testutil.FreePorts(b, 2)
	rpcPort, httpPort := ports[0], ports[1]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "agent.hcl")
	writeFile(b, cfgFile, fmt.Sprintf(`
name = "bench"
data_dir = %q
log_level = "warn"
ports {
  rpc  = %d
  http = %d
}
client {
  plugin_dir = %q
}
consul {
  enabled = false
}
telemetry {
  prometheus_metrics = %t
}
`, filepath.Join(dir, "data"), rpcPort, httpPort, pluginDir, metrics))
	agent := exec.Command(filepath.Join(bin, "csisupd"), "agent", "--config", cfgFile)
	agent.Stderr = os.Stderr
	if err := agent.Start(); err != nil {
		b.Fatal(err)
	}
	defer stopProcess(agent)

	start := time.Now()
	waitAllHealthy(b, fmt.Sprintf("127.0.0.1:%d", rpcPort), n, 2*time.Minute)
	if n > 0 {
		b.ReportMetric(time.Since(start).Seconds(), "all_healthy_s") // the last run's
	}

	ctx, cancel := context.WithCancel(context.Background())
	scrapes := make(chan error, 1)
	go func() {
		scrapes <- scrapeMetrics(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort), n, metrics)
	}()
	cpu0 := testutil.ProcessCPU(b, agent.Process.Pid)
	t0 := time.Now()
	time.Sleep(steadyWindow) // the measurement window itself, not synchronisation
	cpu1 := testutil.ProcessCPU(b, agent.Process.Pid)
	elapsed := time.Since(t0)
	rssMiB = float64(testutil.ProcessRSS(b, agent.Process.Pid)) / (1 << 20)
	cancel()
	if err := <-scrapes; err != nil {
		b.Fatal(err)
	}
	waitAllHealthy(b, fmt.Sprintf("127.0.0.1:%d", rpcPort), n, 10*time.Second)
	return 100 * (cpu1 - cpu0).Seconds() / elapsed.Seconds(), rssMiB
}

// scrapeMetrics scrapes url every metricsScrapeInterval until ctx ends.
// With want, every scrape must answer 200 with the probe histograms of
// the n plugins; without, /metrics must not be served.
func scrapeMetrics(ctx context.Context, url string, n int, want bool) error {
	client := &http.Client{Timeout: 10 * time.Second}
	t := time.NewTicker(metricsScrapeInterval)
	defer t.Stop()
	for {
		resp, err := client.Get(url)
		if err != nil {
			return fmt.Errorf("scrape %s: %w", url, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return fmt.Errorf("scrape %s: %w", url, err)
		case want && (resp.StatusCode != http.StatusOK || strings.Count(string(body), "csisupd_plugin_probe_duration_seconds_count{") != n):
			return fmt.Errorf("scrape %s: status %d without %d probe histograms", url, resp.StatusCode, n)
		case !want && resp.StatusCode != http.StatusNotFound:
			return fmt.Errorf("scrape %s with metrics off: status %d, want 404", url, resp.StatusCode)
		}
		if !want {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// measureDirectSteadyState probes every plugin under pluginDir from this
// process over grpc-go connections and returns this process's CPU, in
// percent of one core, over steadyWindow once every plugin answered, and
// how much its RSS grew (MiB) for the connections and probe loops.
func measureDirectSteadyState(b *testing.B, pluginDir string) (cpuPercent, rssGrowth float64) {
	b.Helper()
	rss0 := testutil.ProcessRSS(b, os.Getpid())
	socks, err := filepath.Glob(filepath.Join(pluginDir, "*", "csi.sock"))
	if err != nil || len(socks) != steadyPlugins {
		b.Fatalf("found %d plugin sockets (%v), want %d", len(socks), err, steadyPlugins)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	var healthy atomic.Int64
	for _, sock := range socks {
		c, err := csiclient.New(csiclient.Config{Socket: sock, Redial: config.DefaultRetry().PluginRedial})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		var counted atomic.Bool
		mon, err := heartbeat.New(heartbeat.Config{
			Identity: c.Identity,
			Timing: func() (time.Duration, time.Duration) {
				return config.DefaultProbeInterval, config.DefaultProbeTimeout
			},
			OnProbe: func(h heartbeat.Result) {
				if h.State == heartbeat.Healthy && !counted.Swap(true) {
					healthy.Add(1)
				}
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { mon.Run(ctx) })
	}
	testutil.WaitFor(b, 2*time.Minute, "every plugin probed directly", func() bool { return healthy.Load() == steadyPlugins })

	cpu0 := testutil.ProcessCPU(b, os.Getpid())
	t0 := time.Now()
	time.Sleep(steadyWindow) // the measurement window itself, not synchronisation
	cpu1 := testutil.ProcessCPU(b, os.Getpid())
	rssGrowth = float64(testutil.ProcessRSS(b, os.Getpid())-rss0) / (1 << 20)
	return 100 * (cpu1 - cpu0).Seconds() / time.Since(t0).Seconds(), rssGrowth
}

// buildBinaries builds csisupd and csi-testplugin into dir/bin.
func buildBinaries(b *testing.B, dir string) string {
	b.Helper()
	bin := filepath.Join(dir, "bin")
	for _, pkg := range []string{"./cmd/csisupd", "./internal/testplugin/cmd/csi-testplugin"} {
		cmd := exec.Command("go", "build", "-o", bin+"/", pkg)
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return bin
}

// waitForLine starts cmd and waits until its standard output prints a line
// starting with prefix.
func waitForLine(b *testing.B, cmd *exec.Cmd, prefix string) {
	b.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), prefix) {
				found <- true
				break
			}
		}
		close(found)
		for sc.Scan() { // keep draining so the child never blocks on a full pipe
		}
	}()
	select {
	case ok := <-found:
		if !ok {
			b.Fatalf("%s exited before printing %q", cmd.Path, prefix)
		}
	case <-time.After(2 * time.Minute):
		b.Fatalf("%s did not print %q within 2 minutes", cmd.Path, prefix)
	}
}

func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	waitOrKill(cmd, 10*time.Second)
}

// waitOrKill waits for a process asked to stop, and kills it if it has not
// exited after grace.
func waitOrKill(cmd *exec.Cmd, grace time.Duration) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// waitAllHealthy polls the agent's ListPlugins until n plugins are healthy.
func waitAllHealthy(b *testing.B, addr string, n int, timeout time.Duration) {
	b.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := csisupdv1.NewAgentClient(conn)
	deadline := time.Now().Add(timeout)
	healthy := 0
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ListPlugins(ctx, &csisupdv1.ListPluginsRequest{})
		cancel()
		if err == nil {
			healthy = 0
			for _, p := range resp.GetPlugins() {
				if p.GetHealthy() {
					healthy++
				}
			}
			if healthy >= n {
				return
			}
		}
		time.Sleep(200 * time.Millisecond) // polling interval of an external process
	}
	b.Fatalf("only %d of %d plugins healthy after %s", healthy, n, timeout)
}

func writeFile(b *testing.B, path, content string) {
	b.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		b.Fatal(err)
	}
}
