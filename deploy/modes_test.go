package deploy_test

// The modes, as the lanes binary registers them: TestCapabilities runs
// each, and the configuration checks look their settings up.
import (
	_ "github.com/lanesnet/lanes/policy/falcon"
	_ "github.com/lanesnet/lanes/policy/fast"
	_ "github.com/lanesnet/lanes/policy/mflow"
	_ "github.com/lanesnet/lanes/policy/prism"
)
