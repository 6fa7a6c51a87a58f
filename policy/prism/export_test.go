package prism

// SetGuardRule makes new guards (the ladder's and bulk-sched's) use r
// until the returned undo.
func SetGuardRule(r GuardRule) (undo func()) {
	old, oldBulk := guardRule, bulkGuardRule
	guardRule, bulkGuardRule = r, r
	return func() { guardRule, bulkGuardRule = old, oldBulk }
}

// GuardOff is the NIC poll's scheduling while the guard holds it off the
// ladder.
const GuardOff = guardOff
