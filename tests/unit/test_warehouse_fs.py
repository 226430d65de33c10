"""Warehouse file operations without a JVM: atomic replace and swap, the commit lock."""

from __future__ import annotations

import threading
import time

from epochsync.warehouse import fs as warehouse_fs


def test_move_replacing_swaps_a_directory_in_and_removes_the_old_one(tmp_path):
    (tmp_path / "new" / "x").mkdir(parents=True)
    (tmp_path / "new" / "x" / "f").write_text("new")
    (tmp_path / "dst" / "old").mkdir(parents=True)
    warehouse_fs.move_replacing(f"file://{tmp_path}/new", f"file://{tmp_path}/dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]
    assert (tmp_path / "dst" / "x" / "f").read_text() == "new" and not (tmp_path / "dst" / "old").exists()
    # into a parent that does not exist yet
    (tmp_path / "more").mkdir()
    warehouse_fs.move_replacing(str(tmp_path / "more"), str(tmp_path / "a" / "b" / "c"))
    assert (tmp_path / "a" / "b" / "c").is_dir()


def test_exchange_dirs_is_one_atomic_step(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "from-a").write_text("")
    (tmp_path / "b").mkdir()
    if not warehouse_fs.exchange_dirs(str(tmp_path / "a"), str(tmp_path / "b")):
        return  # this kernel or file system cannot: move_replacing falls back to two renames
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["from-a"]
    assert list((tmp_path / "a").iterdir()) == []


def test_exists_delete_and_list_dirs(tmp_path):
    (tmp_path / "epoch=1").mkdir()
    (tmp_path / "epoch=2" / "server=M").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    uri = f"file://{tmp_path}"
    assert warehouse_fs.list_dirs(uri) == ["epoch=1", "epoch=2"]
    assert warehouse_fs.list_dirs(f"{uri}/nowhere") == []
    assert warehouse_fs.exists(f"{uri}/file") and warehouse_fs.exists(f"{uri}/epoch=2")
    warehouse_fs.delete(f"{uri}/epoch=2")
    warehouse_fs.delete(f"{uri}/file")
    warehouse_fs.delete(f"{uri}/nowhere")  # nothing there is fine
    assert warehouse_fs.list_dirs(uri) == ["epoch=1"] and not warehouse_fs.exists(f"{uri}/file")


def test_concurrent_atomic_writes_of_one_file_each_land_whole(tmp_path):
    path = str(tmp_path / "d" / "marker.json")
    texts = [str(i) * 100_000 for i in range(8)]
    threads = [threading.Thread(target=warehouse_fs.write_text_atomic, args=(path, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert open(path).read() in texts
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["marker.json"]  # no temporary left


def test_lock_file_makes_holders_take_turns(tmp_path):
    lock = str(tmp_path / "_ingest.lock")
    inside = []
    overlaps = []

    def hold(i):
        with warehouse_fs.lock_file(lock):
            if inside:
                overlaps.append(i)
            inside.append(i)
            time.sleep(0.05)
            inside.remove(i)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
