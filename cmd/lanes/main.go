// Command lanes is the controller, testbed and benchmark of the lanes project.
package main

import "github.com/lanesnet/lanes/internal/cli"

func main() { cli.Execute() }
