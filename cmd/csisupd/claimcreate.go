package main

import (
	"fmt"
	"io"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// claimCreateRequest reads the volume specification file of volume claim
// --create-from (the one volume create -f reads; "-" reads in): the
// volume the claim creates when volume vol does not exist. The volume's
// id is the claim's: a file that sets no id or name serves any volume,
// and one whose id (or name) names another volume than vol is refused,
// naming both, rather than claimed under a name the file does not give.
func claimCreateRequest(file, vol string, in io.Reader) (*csisupdv1.VolumeCreateRequest, error) {
	s, err := readSpec(file, in)
	if err != nil {
		return nil, err
	}
	if s.ID != "" && s.ID != vol {
		return nil, usageError{fmt.Errorf("--create-from %s is the specification of volume %q, not of %q: set its id to %q, or leave id and name out",
			file, s.ID, vol, vol)}
	}
	s.ID = vol
	req, err := s.CreateRequest()
	if err != nil {
		return nil, err
	}
	// The claim names the volume; the servers refuse a create that does.
	req.Id = ""
	return req, nil
}
