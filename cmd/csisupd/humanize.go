package main

import (
	"fmt"
	"strings"
)

// accessModeName prints a CSI access mode as the CLI's flags spell it:
// SINGLE_NODE_WRITER is single-node-writer, the reverse of
// parseAccessMode. An empty mode stays empty. JSON output keeps the CSI
// name: it is the API's.
func accessModeName(mode string) string {
	return strings.ToLower(strings.ReplaceAll(mode, "_", "-"))
}

// formatBytes prints a size in binary units for people: 20 GiB, 1.5 GiB,
// 512 B; one decimal only when the size is not a whole number of its unit.
// Zero or less is "-" (unknown). JSON output keeps the exact bytes.
func formatBytes(n int64) string {
	if n <= 0 {
		return "-"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	if n%div == 0 {
		return fmt.Sprintf("%d %ciB", n/div, "KMGTP"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
