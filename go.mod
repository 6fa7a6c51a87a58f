module github.com/lanesnet/lanes

go 1.26.0

require (
	github.com/spf13/cobra v1.10.2
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	golang.org/x/sync v0.23.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
