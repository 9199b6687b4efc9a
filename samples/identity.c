// SPDX-License-Identifier: GPL-2.0-only
/*
 * Print the identity of a pcifab management endpoint with the ioctl ABI.
 * Usage: identity [/dev/pcifab0]
 * Prints one line: "uapi=1.0 fw_version=04070041 partition=0/2 product=PAX 28XG4".
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/pcifab.h>

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "/dev/pcifab0";
	struct pcifab_version ver = { .size = sizeof(ver) };
	struct pcifab_identity id = { .size = sizeof(id) };
	char product[sizeof(id.product_id) + 1];
	int fd;

	fd = open(path, O_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "identity: cannot open %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (ioctl(fd, PCIFAB_IOCTL_VERSION, &ver) || ioctl(fd, PCIFAB_IOCTL_IDENTITY, &id)) {
		fprintf(stderr, "identity: ioctl on %s: %s\n", path, strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	memcpy(product, id.product_id, sizeof(id.product_id));
	product[sizeof(id.product_id)] = 0;
	for (int i = (int)strlen(product) - 1; i >= 0 && product[i] == ' '; i--)
		product[i] = 0;
	printf("uapi=%u.%u fw_version=%08x partition=%u/%u product=%s\n", ver.major, ver.minor,
	       id.fw_version, id.partition, id.partition_count, product);
	return 0;
}
