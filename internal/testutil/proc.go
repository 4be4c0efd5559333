package testutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times;
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// ProcessCPU returns the user plus system CPU time pid has used, from
// /proc/<pid>/stat.
func ProcessCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the whole line.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: cannot parse utime %q and stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// ProcessRSS returns the resident set size of pid in bytes, from
// /proc/<pid>/status.
func ProcessRSS(t testing.TB, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: %q: %v", pid, line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}
