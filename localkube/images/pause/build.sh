# Host-side recipe of a "scratch" image: compile the static pause binary into $ROOTFS.
gcc -static -O2 -Wall -Werror -o "$ROOTFS/pause" pause.c
strip "$ROOTFS/pause"
