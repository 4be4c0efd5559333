package plugin

import "fmt"

// Instance identifies one instance of a plugin's socket. A socket removed
// and created again at the same path is a new instance: it has a new
// inode, or, when the file system reuses the inode number, a new
// modification time. The modification time of a socket is set by bind(2)
// and, unlike the change time, is not touched by chmod or chown, so
// re-permissioning a socket never restarts its plugin.
type Instance struct {
	Path  string `json:"path"`
	Dev   uint64 `json:"dev"`
	Inode uint64 `json:"inode"`
	Mtime int64  `json:"mtime_ns"`
}

// String formats the identity for logs.
func (i Instance) String() string { return fmt.Sprintf("%s (inode %d)", i.Path, i.Inode) }
