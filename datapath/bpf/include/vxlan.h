/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * VXLAN wire format (RFC 7348), which the kernel keeps out of its UAPI
 * headers (struct vxlanhdr lives in include/net/vxlan.h). Shared by every
 * lanes BPF program that builds or parses overlay frames.
 */
#pragma once

#include <linux/types.h>

/* IANA port; Linux uses it when a vxlan device is created without dstport. */
#define VXLAN_PORT 4789

/* vx_flags bit saying the VNI field is valid (the "I" flag). */
#define VXLAN_FLAG_VNI 0x08000000

struct vxlanhdr {
	__be32 vx_flags; /* VXLAN_FLAG_VNI, rest reserved (0) */
	__be32 vx_vni;   /* VNI in the upper 24 bits, low 8 bits reserved */
};
