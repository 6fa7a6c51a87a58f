package cpuload

//go:generate go tool bpf2go -tags linux -target bpfel cpuacct cpuacct.c -- -I../../datapath/bpf/include -I/usr/include/x86_64-linux-gnu
