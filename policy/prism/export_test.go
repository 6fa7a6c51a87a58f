package prism

// SetGuardRule makes new guards use r until the returned undo.
func SetGuardRule(r GuardRule) (undo func()) {
	old := guardRule
	guardRule = r
	return func() { guardRule = old }
}

// GuardOff is the NIC poll's scheduling while the guard holds it off the
// ladder.
const GuardOff = guardOff
