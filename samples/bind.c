// SPDX-License-Identifier: GPL-2.0-only
/*
 * Bind several functions to one host at once, as one multi-function device (uAPI 1.6).
 * Usage: bind HOST PDFID [PDFID...] [-t TIMEOUT_MS] [-d /dev/pcifab0]
 *        e.g. bind 0 0x0401 0x0402
 * The first PDFID becomes function 0 on the host. All are bound or none.
 * Prints one JSON line: {"ok":true,"host":0,"port":1,"name":"0000:03:00.0"} or
 * {"ok":false,"errno":16,"error":"Device or resource busy","fw_ret":"0x1"}; exit 0 on success.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/pcifab.h>

int main(int argc, char **argv)
{
	const char *path = "/dev/pcifab0";
	struct pcifab_bind b = { .size = sizeof(b), .port = PCIFAB_ANY_PORT };
	unsigned long v;
	char *end;
	int fd, i, n = 0;

	if (argc < 3) {
		fprintf(stderr, "usage: %s HOST PDFID [PDFID...] [-t TIMEOUT_MS] [-d DEVICE]\n",
			argv[0]);
		return 2;
	}
	v = strtoul(argv[1], &end, 0);
	if (*end || v > 0xff) {
		fprintf(stderr, "bind: bad host %s\n", argv[1]);
		return 2;
	}
	b.host = (__u8)v;
	for (i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "-d") && i + 1 < argc) {
			path = argv[++i];
			continue;
		}
		if (!strcmp(argv[i], "-t") && i + 1 < argc) {
			v = strtoul(argv[++i], &end, 0);
			if (*end || v > PCIFAB_BIND_MAX_TIMEOUT_MS) {
				fprintf(stderr, "bind: bad timeout %s\n", argv[i]);
				return 2;
			}
			b.timeout_ms = (__u32)v;
			continue;
		}
		v = strtoul(argv[i], &end, 0);
		if (*end || v > 0xffff || n == PCIFAB_BIND_MAX_PDFIDS) {
			fprintf(stderr, "bind: bad or too many PDFIDs at %s (at most %d)\n", argv[i],
				PCIFAB_BIND_MAX_PDFIDS);
			return 2;
		}
		b.pdfids[n++] = (__u16)v;
	}
	b.pdfid = b.pdfids[0];
	b.nr_pdfids = (__u32)n;
	fd = open(path, O_RDWR);
	if (fd < 0) {
		fprintf(stderr, "bind: cannot open %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (ioctl(fd, PCIFAB_IOCTL_BIND, &b)) {
		int err = errno;

		printf("{\"ok\":false,\"errno\":%d,\"error\":\"%s\",\"fw_ret\":\"0x%x\"}\n", err,
		       strerror(err), b.fw_ret);
		close(fd);
		return 1;
	}
	printf("{\"ok\":true,\"host\":%u,\"port\":%u,\"name\":\"%s\"}\n", b.host, b.port, b.name);
	close(fd);
	return 0;
}
