// SPDX-License-Identifier: GPL-2.0-only
/*
 * Move a function to another host with the pcifab ioctls.
 * Usage: move PDFID HOST [/dev/pcifab0]         e.g. move 0x0300 1
 * Prints one line: "moved 0x0300 from host 0 port 0 to host 1 port 0 [0000:03:00.0]".
 * If the function is not bound anywhere it is simply bound. Exit 0 on success.
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
	const char *path = argc > 3 ? argv[3] : "/dev/pcifab0";
	struct pcifab_move mv = { .size = sizeof(mv) };
	struct pcifab_bind b = { .size = sizeof(b) };
	char *end;
	int fd;

	if (argc < 3) {
		fprintf(stderr, "usage: %s PDFID HOST [DEVICE]\n", argv[0]);
		return 2;
	}
	mv.pdfid = (__u16)strtoul(argv[1], &end, 0);
	mv.host = (__u8)strtoul(argv[2], NULL, 0);
	mv.port = PCIFAB_ANY_PORT;
	fd = open(path, O_RDWR);
	if (fd < 0) {
		fprintf(stderr, "move: cannot open %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (ioctl(fd, PCIFAB_IOCTL_MOVE, &mv) == 0) {
		printf("moved 0x%04x from host %u port %u to host %u port %u [%s]\n", mv.pdfid,
		       mv.from_host, mv.from_port, mv.host, mv.port, mv.name);
		close(fd);
		return 0;
	}
	if (errno != ENOENT) {
		fprintf(stderr, "move: 0x%04x: %s (firmware code 0x%x)\n", mv.pdfid, strerror(errno),
			mv.fw_ret);
		close(fd);
		return 1;
	}
	/* Not bound anywhere: just bind it. */
	b.pdfid = mv.pdfid;
	b.host = mv.host;
	b.port = PCIFAB_ANY_PORT;
	if (ioctl(fd, PCIFAB_IOCTL_BIND, &b)) {
		fprintf(stderr, "move: bind 0x%04x: %s (firmware code 0x%x)\n", b.pdfid,
			strerror(errno), b.fw_ret);
		close(fd);
		return 1;
	}
	printf("bound 0x%04x to host %u port %u [%s]\n", b.pdfid, b.host, b.port, b.name);
	close(fd);
	return 0;
}
