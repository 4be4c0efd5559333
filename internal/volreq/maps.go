package volreq

import "fmt"

// Caps of one string map (parameters, a volume or publish context, the
// accessible topology's segments). CSI's general limit for a map is 4 KiB,
// which a field's description may raise and real drivers exceed; Kubernetes
// allows a StorageClass or VolumeAttributesClass 512 parameters of 256 KiB
// in all. Taking Kubernetes' numbers refuses nothing a driver takes there,
// and keeps a volume's raft entry small.
const (
	MaxMapEntries = 512
	MaxMapBytes   = 256 << 10
)

// MaxSecretsBytes caps the secrets of one request, keys and values: a
// Kubernetes Secret, where CSI secrets usually come from, holds at most
// 1 MiB. Secrets are never stored, only passed to the plugin.
const MaxSecretsBytes = 1 << 20

// Map checks the size of a map that is stored or passed to a plugin.
// field names it in errors.
func Map(field string, m map[string]string) error {
	return mapSize(field, m, MaxMapBytes)
}

// Secrets checks the size of a secrets map. Its errors never hold a value.
func Secrets(field string, m map[string]string) error {
	return mapSize(field, m, MaxSecretsBytes)
}

func mapSize(field string, m map[string]string, maxBytes int) error {
	if len(m) > MaxMapEntries {
		return fmt.Errorf("%s has %d entries, more than the %d allowed", field, len(m), MaxMapEntries)
	}
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	if n > maxBytes {
		return fmt.Errorf("%s holds %d bytes of keys and values, more than the %d allowed", field, n, maxBytes)
	}
	return nil
}

// Capacity checks a capacity range: neither bound negative, and the limit
// not below the minimum when both are set (zero means unset).
func Capacity(minField string, minBytes int64, maxField string, maxBytes int64) error {
	if err := NonNegative(minField, minBytes); err != nil {
		return err
	}
	if err := NonNegative(maxField, maxBytes); err != nil {
		return err
	}
	if minBytes > 0 && maxBytes > 0 && maxBytes < minBytes {
		return fmt.Errorf("%s %d is below %s %d", maxField, maxBytes, minField, minBytes)
	}
	return nil
}

// NonNegative checks one size in bytes.
func NonNegative(field string, n int64) error {
	if n < 0 {
		return fmt.Errorf("%s %d is negative", field, n)
	}
	return nil
}

// MaxNameBytes caps the name a plugin's CreateVolume gets: CSI's limit
// for a string field.
const MaxNameBytes = 128

// Name checks the name of a volume create, which may be empty (the id is
// the name then): at most MaxNameBytes, and text as Text checks it.
func Name(field, name string) error {
	if len(name) > MaxNameBytes {
		return fmt.Errorf("%s is %d bytes, more than the %d allowed", field, len(name), MaxNameBytes)
	}
	return Text(field, name)
}
