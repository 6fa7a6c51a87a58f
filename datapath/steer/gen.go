// Package steer is lanes' stage-placement datapath on stock kernels: BPF
// programs that choose, per (flow, stage), the core that runs the next stage
// of an overlay receive path, and the pinned maps through which the control
// plane sets the placement.
package steer

//go:generate go tool bpf2go -tags linux -target bpfel steer steer.c -- -I../../datapath/bpf/include -I/usr/include/x86_64-linux-gnu
