package config

// The modes the tests apply: cmd/lanes registers them in the binary.
import (
	_ "github.com/lanesnet/lanes/policy/falcon"
	_ "github.com/lanesnet/lanes/policy/fast"
	_ "github.com/lanesnet/lanes/policy/mflow"
	_ "github.com/lanesnet/lanes/policy/prism"
)
