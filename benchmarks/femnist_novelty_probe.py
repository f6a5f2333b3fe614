"""Research probe (issue 20), not part of the product: why FEMNIST rotations and flips stay near 0.7 AUROC.

Part 1 (digits vs all classes, polar features, sklearn GMM) and part 2 (centrally trained
MLP / CNN classifier features). Findings in docs/benchmarks.md; this file is removed in the
next commit."""

# ---- part 1
import numpy as np, sys
from sklearn.decomposition import PCA
from sklearn.mixture import GaussianMixture
from sklearn.metrics import roc_auc_score
from fednovelty.datasets.femnist import make_femnist_federated
from fednovelty.datasets.shifts import transform_images
def flat(img): return img.reshape(len(img), -1).astype(np.float64) / 255.
def unit(f): n = np.linalg.norm(f, axis=1, keepdims=True); return f / np.maximum(n, 1e-12), np.log(np.maximum(n[:, 0], 1e-6))
for digits in (True, False):
  w = make_femnist_federated(200 if digits else 100, random_state=0, digits_only=digits)
  te, tr = w.images_test, w.images_train
  Xu, ln = unit(flat(tr))
  for k, K in ((24, 10), (50, 20)):
    pca = PCA(k, random_state=0).fit(Xu)
    def F(img):
        u, l = unit(flat(img)); return np.c_[pca.transform(u), l]
    g = GaussianMixture(K, random_state=0).fit(F(tr))
    sin = g.score_samples(F(te)); res = {}
    for name in ("scale", "rotate", "hflip"):
        s = g.score_samples(F(transform_images(te, name)))
        y = np.r_[np.zeros(len(sin)), np.ones(len(s))]
        res[name] = round(roc_auc_score(y, -np.r_[sin, s]), 3)
    print("digits", digits, len(tr), "k", k, "K", K, res, flush=True)

# ---- part 2
import numpy as np, torch, time
torch.set_num_threads(1); torch.manual_seed(0)
from sklearn.decomposition import PCA
from sklearn.mixture import GaussianMixture
from sklearn.metrics import roc_auc_score
from fednovelty.datasets.femnist import make_femnist_federated
from fednovelty.datasets.shifts import transform_images
w = make_femnist_federated(100, random_state=0)
Xtr = torch.tensor(w.X_train, dtype=torch.float32); ytr = torch.tensor(w.y_train, dtype=torch.long)
def flat(im): return torch.tensor(im.reshape(len(im), -1) / 255., dtype=torch.float32)
for arch in ("mlp", "cnn"):
    if arch == "mlp":
        body = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU())
        prep = lambda x: x
    else:
        body = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32*5*5, 128), torch.nn.ReLU())
        prep = lambda x: x.view(-1, 1, 28, 28)
    net = torch.nn.Sequential(body, torch.nn.Linear(128, 62))
    opt = torch.optim.Adam(net.parameters(), 1e-3); t=time.time()
    for ep in range(8):
        perm = torch.randperm(len(Xtr))
        for i in range(0, len(Xtr), 64):
            b = perm[i:i+64]; opt.zero_grad()
            torch.nn.functional.cross_entropy(net(prep(Xtr[b])), ytr[b]).backward(); opt.step()
    with torch.no_grad():
        acc = (net(prep(torch.tensor(w.X_val, dtype=torch.float32))).argmax(1).numpy() == w.y_val).mean()
        F = lambda x: body(prep(x)).numpy().astype(np.float64)
        ftr = F(Xtr); fin = F(flat(w.images_test))
        pca = PCA(24, random_state=0).fit(ftr)
        g = GaussianMixture(10, random_state=0, reg_covar=1e-4).fit(pca.transform(ftr))
        sin = g.score_samples(pca.transform(fin)); res = {}
        for name in ("scale", "rotate", "hflip"):
            s = g.score_samples(pca.transform(F(flat(transform_images(w.images_test, name)))))
            y = np.r_[np.zeros(len(sin)), np.ones(len(s))]
            res[name] = round(roc_auc_score(y, -np.r_[sin, s]), 3)
    print(arch, "val acc", round(acc, 3), res, round(time.time()-t, 1), flush=True)
