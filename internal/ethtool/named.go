package ethtool

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Features that have no legacy command of their own are reached by name
// through the feature string set: ETHTOOL_GSSET_INFO gives the set's size,
// ETHTOOL_GSTRINGS its names (a name's index is its bit in the device's
// netdev_features_t), ETHTOOL_GFEATURES and ETHTOOL_SFEATURES the bits.
const (
	cmdGSTRINGS  = 0x1b
	cmdGSSETINFO = 0x37
	cmdGFEATURES = 0x3a
	cmdSFEATURES = 0x3b

	ssFeatures = 4  // ETH_SS_FEATURES
	gstringLen = 32 // ETH_GSTRING_LEN
)

// featureNames returns the names of the kernel's device features in bit
// order, as ethtool -k prints them.
func featureNames(netns, dev string) ([]string, error) {
	// struct ethtool_sset_info: cmd, reserved, sset_mask (u64), data[1].
	info := make([]byte, 4+4+8+4)
	binary.NativeEndian.PutUint32(info[0:], cmdGSSETINFO)
	binary.NativeEndian.PutUint64(info[8:], 1<<ssFeatures)
	if err := ioctlPtr(netns, dev, unsafe.Pointer(&info[0])); err != nil {
		return nil, err
	}
	if binary.NativeEndian.Uint64(info[8:])&(1<<ssFeatures) == 0 {
		return nil, fmt.Errorf("no feature names")
	}
	n := int(binary.NativeEndian.Uint32(info[16:]))
	if n <= 0 || n > 1024 {
		return nil, fmt.Errorf("%d feature names", n)
	}
	// struct ethtool_gstrings: cmd, string_set, len, data[len * 32].
	buf := make([]byte, 12+n*gstringLen)
	binary.NativeEndian.PutUint32(buf[0:], cmdGSTRINGS)
	binary.NativeEndian.PutUint32(buf[4:], ssFeatures)
	binary.NativeEndian.PutUint32(buf[8:], uint32(n))
	if err := ioctlPtr(netns, dev, unsafe.Pointer(&buf[0])); err != nil {
		return nil, err
	}
	// The kernel writes its own count: more than asked for would have
	// overrun the buffer, fewer leaves names unfilled.
	if got := int(binary.NativeEndian.Uint32(buf[8:])); got != n {
		return nil, fmt.Errorf("feature names: asked for %d, the kernel gave %d", n, got)
	}
	names := make([]string, n)
	for i := range names {
		s := buf[12+i*gstringLen : 12+(i+1)*gstringLen]
		if j := bytes.IndexByte(s, 0); j >= 0 {
			s = s[:j]
		}
		names[i] = string(s)
	}
	return names, nil
}

// blocks is the number of 32-bit words the feature bits take.
func blocks(n int) int { return (n + 31) / 32 }

// activeBits reads the active features as one bit per name index.
func activeBits(netns, dev string, n int) ([]uint32, error) {
	// struct ethtool_gfeatures: cmd, size, then per block available,
	// requested, active, never_changed.
	words := blocks(n)
	buf := make([]byte, 8+words*16)
	binary.NativeEndian.PutUint32(buf[0:], cmdGFEATURES)
	binary.NativeEndian.PutUint32(buf[4:], uint32(words))
	if err := ioctlPtr(netns, dev, unsafe.Pointer(&buf[0])); err != nil {
		return nil, err
	}
	active := make([]uint32, words)
	for i := range active {
		active[i] = binary.NativeEndian.Uint32(buf[8+i*16+8:])
	}
	return active, nil
}

// GetNamed reports, for each of names, whether dev in netns has that
// feature on (ethtool -k's name, e.g. "rx-udp-gro-forwarding"). A name the
// kernel does not know is an error: a caller that depends on a feature
// being off must not take "unknown" for off.
func GetNamed(netns, dev string, names ...string) (map[string]bool, error) {
	all, err := featureNames(netns, dev)
	if err != nil {
		return nil, fmt.Errorf("reading the feature names of %s: %w", dev, err)
	}
	active, err := activeBits(netns, dev, len(all))
	if err != nil {
		return nil, fmt.Errorf("reading the features of %s: %w", dev, err)
	}
	out := make(map[string]bool, len(names))
	for _, name := range names {
		i := indexOf(all, name)
		if i < 0 {
			return nil, fmt.Errorf("%s: the kernel has no feature %q", dev, name)
		}
		out[name] = active[i/32]&(1<<(i%32)) != 0
	}
	return out, nil
}

// SetNamed turns the named feature on or off for dev in netns and checks
// that the kernel took it.
func SetNamed(netns, dev, name string, on bool) error {
	all, err := featureNames(netns, dev)
	if err != nil {
		return fmt.Errorf("reading the feature names of %s: %w", dev, err)
	}
	i := indexOf(all, name)
	if i < 0 {
		return fmt.Errorf("%s: the kernel has no feature %q", dev, name)
	}
	// struct ethtool_sfeatures: cmd, size, then per block valid and
	// requested. The kernel wants size to be exactly its own word count,
	// which is the string set's (one name per bit).
	words := blocks(len(all))
	buf := make([]byte, 8+words*8)
	binary.NativeEndian.PutUint32(buf[0:], cmdSFEATURES)
	binary.NativeEndian.PutUint32(buf[4:], uint32(words))
	bit := uint32(1) << (i % 32)
	binary.NativeEndian.PutUint32(buf[8+(i/32)*8:], bit)
	if on {
		binary.NativeEndian.PutUint32(buf[8+(i/32)*8+4:], bit)
	}
	if err := ioctlPtr(netns, dev, unsafe.Pointer(&buf[0])); err != nil {
		return fmt.Errorf("setting %s of %s: %w", name, dev, err)
	}
	got, err := GetNamed(netns, dev, name)
	if err != nil {
		return err
	}
	if got[name] != on {
		return fmt.Errorf("setting %s of %s to %v: the kernel kept %v", name, dev, on, got[name])
	}
	return nil
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}
