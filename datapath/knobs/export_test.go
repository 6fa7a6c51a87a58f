package knobs

// SetTestAfterRecord installs a hook run between journaling a knob and
// writing it.
func SetTestAfterRecord(f func(Knob)) { testAfterRecord = f }

// Decode rebuilds a knob from its journal form.
func Decode(kind string, raw []byte) (Knob, error) { return decode(kind, raw) }
