"""The files next to a checkpoint (issue 47, "Nothing lost"): its lock file.

* a symlink at ``PATH.lock`` made the run create the link's target outside the
  checkpoint's folder -> test_a_symlink_at_the_lock_path_is_refused_and_never_followed
* a directory, or another user's unwritable file, at ``PATH.lock``: an
  ``IsADirectoryError`` / ``PermissionError`` traceback ->
  test_a_directory_at_the_lock_path_is_a_clear_error,
  test_a_lock_file_that_cannot_be_opened_is_a_clear_error,
  test_another_users_lock_file_is_a_clear_error
* a finished run left ``PATH.lock`` behind -> test_a_run_removes_its_lock_file
"""

import os

import jax
import jax.numpy as jnp
import pytest

import cenlmc_jax as cj
from cenlmc_jax import checkpoint as ckpt

ALGO = cj.lmc(lambda x: -0.5 * jnp.sum(x**2), 0.1)
STATE = ALGO.init(jnp.zeros((8, 2)))


def run(path):
    return cj.sample(
        jax.random.key(0),
        ALGO,
        STATE,
        10,
        checkpoint_path=str(path),
        check_convergence=False,
    )


def test_a_symlink_at_the_lock_path_is_refused_and_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "target"
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "checkpoint.npz"
    os.symlink(target, str(path) + ".lock")
    with pytest.raises(
        ValueError, match=r"checkpoint\.npz\.lock.*symbolic link.*remove"
    ):
        run(path)
    assert not os.path.lexists(target)  # nothing created outside the folder
    assert not path.exists()
    # the link made between the check and the open: O_NOFOLLOW refuses it too
    with pytest.raises(ValueError, match="symbolic link"):
        with ckpt.writer_lock(str(path)):
            pass
    assert not os.path.lexists(target)
    # a symlink at the chunk folder would put the chunks elsewhere: refused too
    os.remove(str(path) + ".lock")
    os.symlink(elsewhere, ckpt.chunk_dir(str(path)))
    with pytest.raises(ValueError, match=r"\.chunks.*symbolic link"):
        run(path)
    assert os.listdir(elsewhere) == []


def test_a_directory_at_the_lock_path_is_a_clear_error(tmp_path):
    path = tmp_path / "checkpoint.npz"
    os.mkdir(str(path) + ".lock")
    with pytest.raises(
        ValueError, match=r"checkpoint\.npz\.lock.*is a directory.*remove"
    ):
        run(path)
    with pytest.raises(ValueError, match="is a directory"):
        with ckpt.writer_lock(str(path)):
            pass


def test_a_lock_file_that_cannot_be_opened_is_a_clear_error(tmp_path, monkeypatch):
    """Another user's lock file, simulated (tests may run as root, where a chmod 000
    file opens anyway): the open raises PermissionError."""
    path = tmp_path / "checkpoint.npz"
    (tmp_path / "checkpoint.npz.lock").write_text("")
    real_os_open = os.open

    def deny(name, *args, **kwargs):
        if str(name).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(name))
        return real_os_open(name, *args, **kwargs)

    def deny_builtin(name, *args, **kwargs):
        if str(name).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(name))
        return open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    monkeypatch.setattr(ckpt, "open", deny_builtin, raising=False)
    with pytest.raises(
        ValueError, match=r"checkpoint\.npz\.lock.*cannot be opened.*remove it"
    ):
        run(path)
    assert not path.exists()


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root opens a chmod 000 file anyway: the permission case cannot arise "
    "(test_a_lock_file_that_cannot_be_opened_is_a_clear_error simulates it)",
)
def test_another_users_lock_file_is_a_clear_error(tmp_path):
    path = tmp_path / "checkpoint.npz"
    lock = tmp_path / "checkpoint.npz.lock"
    lock.write_text("")
    lock.chmod(0)
    try:
        with pytest.raises(ValueError, match=r"checkpoint\.npz\.lock.*remove"):
            run(path)
    finally:
        lock.chmod(0o600)


def test_a_run_removes_its_lock_file(tmp_path):
    path = tmp_path / "checkpoint.npz"
    run(path)
    assert path.exists() and not os.path.lexists(str(path) + ".lock")
    # a lock left by a run that was killed (nobody holds it) is taken, then removed
    (tmp_path / "checkpoint.npz.lock").write_text("")
    run(path)
    assert not os.path.lexists(str(path) + ".lock")
    # while held, a second run is refused and the holder's lock stays
    with ckpt.writer_lock(str(path)):
        with pytest.raises(ValueError, match="in use by another run"):
            run(path)
        assert os.path.exists(str(path) + ".lock")
    assert not os.path.lexists(str(path) + ".lock")
