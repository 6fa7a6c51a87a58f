// Package vmtest is what a test needs to know about the guest-kernel
// harness (scripts/vm): whether it runs in a harness guest, on which of the
// matrix's kernels, and what the running kernel was built with, so that a
// test of a kernel feature can skip with the reason where the feature is
// missing and run where it is there.
package vmtest

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/lanesnet/lanes/internal/kver"
)

// Environment run.sh sets for the command it runs in a guest.
const (
	// EnvKernel names the kernel the guest booted as run.sh was given it
	// (newest, 6.12 or a path).
	EnvKernel = "LANES_VM_KERNEL"
	// EnvOut is the guest's writable directory, the same path on the host.
	EnvOut = "LANES_VM_OUT"
	// EnvConfig is the path of the guest kernel's build configuration
	// (a guest has no /proc/config.gz and the host's /boot is not its own).
	EnvConfig = "LANES_VM_KCONFIG"
)

// Guest is the kernel a harness guest was booted with ("newest", "6.12",
// or a path) and whether the caller runs in such a guest at all.
func Guest() (kernel string, ok bool) {
	return os.LookupEnv(EnvKernel)
}

// OutDir is a directory that outlives the guest (its contents are on the
// host after the run), or "" outside a guest.
func OutDir() string { return os.Getenv(EnvOut) }

var (
	configOnce sync.Once
	config     map[string]string
	configFrom string
	configErr  error
)

// Config returns the running kernel's value for a configuration option
// ("CONFIG_NET_SCH_BPF": "y", "m", a string, or "" when unset) and the
// file it was read from. The configuration is looked for at
// $LANES_VM_KCONFIG, /proc/config.gz, /boot/config-RELEASE and
// /usr/lib/modules/RELEASE/config; an error when none can be read, which
// is not the same as the option being off.
func Config(option string) (value, from string, err error) {
	configOnce.Do(loadConfig)
	if configErr != nil {
		return "", "", configErr
	}
	return config[option], configFrom, nil
}

// RequireConfig skips t unless the running kernel was built with option
// set to y (built in) or m (a module), saying which kernel lacks it. When
// the configuration cannot be read, t runs: a missing feature then shows
// up in the test's own probe.
func RequireConfig(t testing.TB, option string) {
	t.Helper()
	v, from, err := Config(option)
	if err != nil {
		t.Logf("cannot check %s: %v", option, err)
		return
	}
	if v != "y" && v != "m" {
		rel, _ := kver.Release()
		t.Skipf("kernel %s is built without %s (%s)", rel, option, from)
	}
}

func loadConfig() {
	rel, err := kver.Release()
	if err != nil {
		configErr = err
		return
	}
	var tried []string
	for _, p := range []string{os.Getenv(EnvConfig), "/proc/config.gz", "/boot/config-" + rel, "/usr/lib/modules/" + rel + "/config"} {
		if p == "" {
			continue
		}
		tried = append(tried, p)
		m, err := readConfig(p)
		if err != nil {
			continue
		}
		config, configFrom = m, p
		return
	}
	configErr = fmt.Errorf("no configuration of kernel %s found (tried %s)", rel, strings.Join(tried, ", "))
}

func readConfig(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	return parseConfig(r)
}

// parseConfig reads a kernel .config: "CONFIG_X=v" lines; "# CONFIG_X is
// not set" and comments leave the option out.
func parseConfig(r io.Reader) (map[string]string, error) {
	m := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "CONFIG_") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		m[k] = strings.Trim(v, `"`)
	}
	return m, sc.Err()
}
