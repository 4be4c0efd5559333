package volspec

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize accepts, longest first, so that
// "GiB" is not read as "B" after a number "1Gi".
var sizeUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"PiB", 1 << 50},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
	{"B", 1},
}

// ParseSize parses a byte size such as 1GiB, 500MB, 10Gi, 10G or 4096:
// binary units for the "i" suffixes, decimal ones otherwise, as Nomad's
// capacity_min and capacity_max read them. The CLI's size flags use it
// too, so a size means the same in a flag and in a file.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, factor = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.factor
			break
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, fmt.Errorf("%q is not a size (examples: 1GiB, 500MB, 4096)", s)
	}
	b := n * float64(factor)
	// float64(math.MaxInt64) rounds up to 2^63, which int64 cannot hold:
	// refuse it too rather than let the conversion wrap.
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(b), nil
}
