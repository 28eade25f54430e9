import sys, torch, gc
case = sys.argv[1]
a = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(a):
    xs = [torch.empty(1 << 20, device="cuda") for _ in range(4)]
b = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(b):
    y = torch.empty(1 << 20, device="cuda")
    if case == "pool_first_in_b":
        del a; del xs
    elif case == "tensors_first_in_b":
        del xs; del a
    elif case == "graph_in_b":
        g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    z2 = torch.empty(1 << 22, device="cuda")
print(case, "ok", flush=True)
