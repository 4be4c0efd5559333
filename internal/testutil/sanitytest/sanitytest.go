// Package sanitytest runs csi-sanity (kubernetes-csi/csi-test pkg/sanity)
// against several endpoints in one Ginkgo suite and reports the outcome of
// every spec by run, so that a test can prove a mediated path answers as
// the plugin does: the same specs must pass directly and through it.
// ServeAdapter serves the endpoint of such a mediated path, and
// IgnoreGinkgo is the goleak option the test binaries that run it need.
//
// Ginkgo runs one suite per process, so a test binary calls Run once, and
// `go test -count` above 1 is refused by Ginkgo.
package sanitytest

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"k8s.io/klog/v2"
)

// Passed, Skipped are the outcomes of a spec that did not fail; a failed
// spec's outcome is its state and failure message.
const (
	Passed  = "passed"
	Skipped = "skipped"
)

// Target is one run of the suite: csi-sanity against one configuration.
type Target struct {
	// Name names the run; it is the top container of its specs.
	Name   string
	Config *sanity.TestConfig
}

// Outcomes holds, by run name, the outcome of every spec by its text (the
// containers below the run's, then the spec's own text, joined by spaces).
type Outcomes map[string]map[string]string

// Passed returns the specs of run that passed, sorted.
func (o Outcomes) Passed(run string) []string {
	var out []string
	for text, outcome := range o[run] {
		if outcome == Passed {
			out = append(out, text)
		}
	}
	slices.Sort(out)
	return out
}

// failRecorder records a Ginkgo failure without failing the Go test, so
// that the runs can be compared first.
type failRecorder struct{ failed bool }

func (f *failRecorder) Fail() { f.failed = true }

// Run runs csi-sanity once for each target in one Ginkgo suite titled
// title and returns the outcome of every spec.
func Run(title string, targets ...Target) Outcomes {
	outcomes := Outcomes{}
	var contexts []*sanity.TestContext
	for _, target := range targets {
		outcomes[target.Name] = map[string]string{}
		ginkgo.Describe(target.Name, func() {
			contexts = append(contexts, sanity.GinkgoTest(target.Config))
		})
	}
	ginkgo.ReportAfterSuite("record outcomes", func(r ginkgo.Report) {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt || len(s.ContainerHierarchyTexts) == 0 {
				continue
			}
			run := s.ContainerHierarchyTexts[0]
			text := strings.Join(append(slices.Clone(s.ContainerHierarchyTexts[1:]), s.LeafNodeText), " ")
			switch {
			case s.State.Is(types.SpecStatePassed):
				outcomes[run][text] = Passed
			case s.State.Is(types.SpecStateSkipped | types.SpecStatePending):
				outcomes[run][text] = Skipped
			default:
				outcomes[run][text] = fmt.Sprintf("%s: %s", s.State, s.Failure.Message)
			}
		}
	})
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	reporter.Succinct = true
	reporter.NoColor = true
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	ginkgo.RunSpecs(&failRecorder{}, title, suite, reporter)
	for _, sc := range contexts {
		sc.Finalize()
	}
	return outcomes
}
