#!/bin/sh
# One-off (root): run node.memcg_probe and a cgroup2 reclaim inside a guest booted from a root
# directory's own kernel under TCG, with this tree's runc_guard copied in (issue 42 case 3 d).
#   bench/memcg_probe_guest.sh ROOT [KERNEL_RELEASE]
# ROOT: a debootstrapped root with a kernel in /boot and python3 (the VM lab's Debian 12 root,
# or a sid one). The root is never written: an overlay over it is copied into a scratch ext4
# image (mkfs.ext4 -d), booted with init= this script's guest part, powered off at the end.
set -eu
root=$1
release=${2:-$(ls "$root/boot" | sed -n 's/^vmlinuz-//p' | sort -V | tail -1)}
tree=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /var/tmp/rg-probe-guest.XXXXXX)
trap 'umount "$work/merged" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/upper" "$work/work" "$work/merged"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$work/upper,workdir=$work/work" "$work/merged"
mkdir -p "$work/merged/rg"
cp -r "$tree/runc_guard" "$work/merged/rg/"
cat > "$work/merged/rg/init.sh" <<'GUEST'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t tmpfs tmp /run; mount -t tmpfs tmp /tmp
mount -o remount,rw /
mount -t cgroup2 none /sys/fs/cgroup
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
echo "RG uname $(uname -r)"
cd /rg
PYTHONPATH=/rg python3 -c "
import time
from runc_guard.delete.cgroupfs import cgroup_mounts
from runc_guard.node.memcg_probe import probe
for i in range(3):
    t = time.monotonic(); print('RG probe', probe(cgroup_mounts()), round(time.monotonic() - t, 2), 's', flush=True)
"
# a memcg that read 1 MiB and one that wrote 1 MiB, removed: dying 5 s later?
dd if=/dev/urandom of=/var/tmp/rgread bs=64k count=16 conv=fsync status=none
echo 3 > /proc/sys/vm/drop_caches
for mode in read write; do
  P=/sys/fs/cgroup/rg-$mode; mkdir $P; echo +memory > $P/cgroup.subtree_control; mkdir $P/c
  if [ $mode = read ]; then cmd="cat /var/tmp/rgread"; else cmd="dd if=/dev/zero of=/var/tmp/rgwrite bs=64k count=16 conv=fsync status=none"; fi
  sh -c "echo \$\$ > $P/c/cgroup.procs; exec $cmd > /dev/null"
  rmdir $P/c; sleep 5
  echo "RG $mode: $(grep nr_dying_desc $P/cgroup.stat), parent memory.current $(cat $P/memory.current)"
done
# cgroup2 reclaim of a dead memcg's 8 MiB: the writes it makes (swap ruled out first)
C=/sys/fs/cgroup/rg-v2; mkdir $C
sh -c "echo \$\$ > $C/cgroup.procs; exec dd if=/dev/zero of=/var/tmp/rgfile bs=1M count=8 conv=fsync status=none"
PYTHONPATH=/rg python3 -c "
import time
from runc_guard.delete import reclaim
real = reclaim.write_control
def write(path, data):
    r = real(path, data); print('RG write', path.rsplit('/', 1)[-1], data.decode(), '->', r, flush=True); return r
reclaim.write_control = write
r = reclaim.reclaim('$C', time.monotonic() + 0.5)
print('RG reclaim', r.method, r.before, r.after, r.skipped or '-', flush=True)
"
echo "RG done"
echo o > /proc/sysrq-trigger
sleep 30
GUEST
chmod +x "$work/merged/rg/init.sh"
truncate -s 2G "$work/disk.img"
mkfs.ext4 -q -d "$work/merged" "$work/disk.img"
umount "$work/merged"
timeout 900 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 1024 \
  -kernel "$root/boot/vmlinuz-$release" -initrd "$root/boot/initrd.img-$release" \
  -append "root=/dev/vda rw console=ttyS0 init=/rg/init.sh quiet" \
  -drive "file=$work/disk.img,if=virtio,format=raw" -nic none -nographic -no-reboot \
  > "$work/console.log" 2>&1 || true
grep -a '^RG \|RG ' "$work/console.log" | sed 's/.*RG /RG /'
