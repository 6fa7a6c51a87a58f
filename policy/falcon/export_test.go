package falcon

import "errors"

// ParkLikeAKilledAgent parks the target's path as an agent does and leaves
// it so, as an agent killed while parked would.
func ParkLikeAKilledAgent(stateDir string) error {
	o := Defaults()
	o.Split = false // split=auto on the testbed's veth underlay
	p, err := newParker(o, stateDir)
	if err != nil {
		return err
	}
	if p.off != "" {
		return errors.New("cannot park: " + p.off)
	}
	return p.park()
}
