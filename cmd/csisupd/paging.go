package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// maxPageSize is the largest page the servers hand out per call.
const maxPageSize = 1000

// pageFlag adds --page-size to a list command.
func pageFlag(cmd *cobra.Command, size *uint32) {
	cmd.Flags().Uint32Var(size, "page-size", 0,
		fmt.Sprintf("ask the servers for this many entries per call (at most %d; 0: all in one call); every page is listed", maxPageSize))
}

// listAllPages calls page from the first token until a page comes back
// without a next token, so a list with --page-size prints the same
// entries as one without. A token seen twice ends it with an error
// rather than a loop.
func listAllPages(page func(token string) (next string, err error)) error {
	seen := map[string]bool{}
	token := ""
	for {
		next, err := page(token)
		if err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		if seen[next] {
			return fmt.Errorf("the server returned the page token %q twice", next)
		}
		seen[next] = true
		token = next
	}
}
