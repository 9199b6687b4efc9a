// SPDX-License-Identifier: GPL-2.0-only
/*
 * Read a function's device memory into host memory with the MEP's DMA engine.
 * Usage: p2p PDFID OFFSET LENGTH [/dev/pcifab0]
 *
 * Lists this host's P2P routes (PCIFAB_IOCTL_P2P_ROUTES), then copies LENGTH
 * bytes from PDFID's device memory at OFFSET into a user buffer
 * (PCIFAB_IOCTL_P2P_COPY; a route must cover the range) and prints one line:
 * "routes=N bytes=LENGTH fnv1a64=<16 hex digits>", the FNV-1a hash of the data.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/pcifab.h>

static uint64_t fnv1a64(const unsigned char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	while (n--) {
		h ^= *p++;
		h *= 0x100000001b3ULL;
	}
	return h;
}

int main(int argc, char **argv)
{
	struct pcifab_route routes[PCIFAB_P2P_MAX_ROUTES];
	struct pcifab_p2p_routes list = {
		.size = sizeof(list),
		.nr_routes = PCIFAB_P2P_MAX_ROUTES,
		.route_size = sizeof(routes[0]),
		.routes_ptr = (uintptr_t)routes,
	};
	struct pcifab_p2p_copy copy = { .size = sizeof(copy) };
	const char *path = argc > 4 ? argv[4] : "/dev/pcifab0";
	unsigned char *buf;
	char *end;
	int fd;

	if (argc < 4) {
		fprintf(stderr, "usage: p2p PDFID OFFSET LENGTH [/dev/pcifab0]\n");
		return 2;
	}
	copy.src.kind = PCIFAB_P2P_FUNCTION;
	copy.src.pdfid = (__u16)strtoul(argv[1], &end, 0);
	copy.src.addr = strtoull(argv[2], &end, 0);
	copy.len = strtoull(argv[3], &end, 0);
	if (*end || copy.len == 0 || copy.len > PCIFAB_P2P_MAX_LEN) {
		fprintf(stderr, "p2p: LENGTH must be 1 to %llu bytes\n",
			(unsigned long long)PCIFAB_P2P_MAX_LEN);
		return 2;
	}
	buf = calloc(1, copy.len);
	if (!buf) {
		fprintf(stderr, "p2p: no memory for %llu bytes\n", (unsigned long long)copy.len);
		return 1;
	}
	copy.dst.kind = PCIFAB_P2P_USER;
	copy.dst.addr = (uintptr_t)buf;

	fd = open(path, O_RDWR);
	if (fd < 0) {
		fprintf(stderr, "p2p: cannot open %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (ioctl(fd, PCIFAB_IOCTL_P2P_ROUTES, &list)) {
		fprintf(stderr, "p2p: PCIFAB_IOCTL_P2P_ROUTES: %s\n", strerror(errno));
		return 1;
	}
	if (ioctl(fd, PCIFAB_IOCTL_P2P_COPY, &copy)) {
		fprintf(stderr, "p2p: copy from 0x%04x:0x%llx: %s (%llu bytes done, engine status %u)%s\n",
			copy.src.pdfid, (unsigned long long)copy.src.addr, strerror(errno),
			(unsigned long long)copy.done, copy.dma_status,
			errno == ENOENT ? "; add a route with `pcifab p2p route add`" : "");
		return 1;
	}
	printf("routes=%u bytes=%llu fnv1a64=%016llx\n", list.nr_routes,
	       (unsigned long long)copy.done, (unsigned long long)fnv1a64(buf, copy.len));
	free(buf);
	close(fd);
	return 0;
}
