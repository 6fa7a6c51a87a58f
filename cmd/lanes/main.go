// Command lanes is the controller, testbed and benchmark of the lanes project.
package main

import (
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/internal/cli"
)

func main() {
	// The benchmark starts this binary under another name for its helper
	// processes (the paced ping-pong client): they run and exit here.
	workload.RunHelper()
	cli.Execute()
}
