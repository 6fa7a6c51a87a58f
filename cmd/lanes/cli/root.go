// Package cli is the `lanes` command line: one file per subcommand, each
// registering itself, so commands stay independent of each other.
package cli

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
)

var commands []func() *cobra.Command

// register adds a subcommand constructor; called from each command file's init.
func register(f func() *cobra.Command) { commands = append(commands, f) }

// Version is the lanes version, from the build info.
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "lanes",
		Short: "Fast and fair receive processing for container overlay networks",
		Long: `lanes spreads and prioritizes the receive-side processing of container overlay
networks (VXLAN + bridge + veth) across cores, using eBPF and kernel knobs on an
unmodified kernel: Falcon's pipelining, splitting and balancing, MFLOW's
micro-flows and PRISM's priorities, under one control plane.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version(),
	}
	for _, f := range commands {
		root.AddCommand(f())
	}
	return root
}

// Execute runs the CLI and exits with 1 and a one-line error on failure
// (a line per problem of a configuration file), or with the error's own
// exit code where it has one (config.ExitConfig for a bad file).
func Execute() {
	if err := NewRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "lanes:", err)
		os.Exit(exitCode(err))
	}
}

func exitCode(err error) int {
	var c interface{ ExitCode() int }
	if errors.As(err, &c) {
		return c.ExitCode()
	}
	return 1
}
