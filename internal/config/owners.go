package config

import (
	"errors"
	"fmt"
	"math"
	"os/user"
	"slices"
	"strconv"
)

// pluginOwners resolves client.plugin_owners to uids: a number is a uid
// as it is (it need not have a user), anything else a user name looked up
// in the system's user database. It returns nil for an empty list.
func (v *validator) pluginOwners(owners []string) []uint32 {
	const key = "client.plugin_owners"
	var uids []uint32
	for i, o := range owners {
		uid, err := resolveOwner(o)
		if err != nil {
			v.add(key, "element %d: %w", i, err)
			continue
		}
		if !slices.Contains(uids, uid) {
			uids = append(uids, uid)
		}
	}
	return uids
}

// resolveOwner returns the uid of owner, a user name or a numeric uid.
func resolveOwner(owner string) (uint32, error) {
	if owner == "" {
		return 0, errors.New("empty: give a user name or a numeric uid")
	}
	if owner[0] >= '0' && owner[0] <= '9' {
		uid, err := strconv.ParseUint(owner, 10, 32)
		if err != nil || uid == math.MaxUint32 {
			return 0, fmt.Errorf("%q is not a valid uid (0 to %d)", owner, uint32(math.MaxUint32-1))
		}
		return uint32(uid), nil
	}
	u, err := user.Lookup(owner)
	if err != nil {
		if errors.As(err, new(user.UnknownUserError)) {
			return 0, fmt.Errorf("unknown user %q", owner)
		}
		return 0, fmt.Errorf("look up user %q: %w", owner, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("user %q has uid %q, not a number", owner, u.Uid)
	}
	return uint32(uid), nil
}
