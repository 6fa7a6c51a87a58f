// Command lanes is the controller, testbed and benchmark of the lanes project.
package main

import (
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/cmd/lanes/cli"

	// The modes: each policy registers its planner and agents with
	// control/plan, which control and the CLI look them up in.
	_ "github.com/lanesnet/lanes/policy/falcon" // falcon and its single-mechanism modes
	_ "github.com/lanesnet/lanes/policy/fast"   // fast
	_ "github.com/lanesnet/lanes/policy/mflow"  // mflow
	_ "github.com/lanesnet/lanes/policy/prism"  // prism, prism-batch, prism-sync
)

func main() {
	// The benchmark starts this binary under another name for its helper
	// processes (the paced ping-pong client): they run and exit here.
	workload.RunHelper()
	cli.Execute()
}
