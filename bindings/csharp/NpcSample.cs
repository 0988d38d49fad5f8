// A C# host over Strata.Native: one NPC session greets the player, stepping the model with a
// per-frame budget as a game loop would, with the library's log routed to the console.
//   usage: NpcSample [MODEL]
using System;
using System.Runtime.InteropServices;
using System.Text;
using static Strata.Native;

public static class NpcSample
{
    // Kept in a static field: the library calls it for as long as it is set.
    static readonly moe_log_fn Log = (level, msg, user) =>
        Console.WriteLine("[strata " + level + "] " + Marshal.PtrToStringUTF8(msg));

    static void Check(int st, string what)
    {
        if (st != MOE_OK)
            throw new Exception(what + ": " + LastError() + " (" + Marshal.PtrToStringUTF8(moe_status_string(st)) + ")");
    }

    public static int Main(string[] args)
    {
        string model = args.Length > 0 ? args[0] : "examples/models/austen-moe-q4_k.gguf";
        moe_log_set(Log, IntPtr.Zero);
        IntPtr path = Marshal.StringToCoTaskMemUTF8(model);
        IntPtr ctx = IntPtr.Zero, s = IntPtr.Zero;
        try
        {
            var p = new moe_params();
            moe_params_init(ref p);
            p.model_path = path;
            Check(moe_ctx_open(ref p, out ctx), "moe_ctx_open");
            var sp = new moe_session_params();
            moe_session_params_init(ref sp);
            sp.temperature = 0.8f;
            Check(moe_session_open(ctx, ref sp, out s), "moe_session_open");
            byte[] text = Encoding.UTF8.GetBytes("It is a truth universally acknowledged");
            Check(moe_tokenize(ctx, "It is a truth universally acknowledged", (UIntPtr)text.Length,
                               MOE_TOKENIZE_ADD_BOS, null, UIntPtr.Zero, out UIntPtr n), "size");
            var ids = new int[(int)n];
            Check(moe_tokenize(ctx, "It is a truth universally acknowledged", (UIntPtr)text.Length,
                               MOE_TOKENIZE_ADD_BOS, ids, n, out n), "moe_tokenize");
            Check(moe_session_feed(s, ids, n), "moe_session_feed");
            var line = new StringBuilder();
            for (int frame = 0, tokens = 0; tokens < 24; ++frame)
            {
                Check(moe_ctx_step_for(ctx, 4000, out uint pending, out uint steps), "moe_ctx_step_for");
                if (moe_session_ready(s) != 1) continue;
                Check(moe_session_sample_text(s, out int token, out IntPtr piece, out UIntPtr len, out int stop),
                      "moe_session_sample_text");
                line.Append(Marshal.PtrToStringUTF8(piece, (int)len));
                if (stop != MOE_STOP_NONE) break;
                Check(moe_session_feed(s, new[] { token }, (UIntPtr)1), "moe_session_feed");
                ++tokens;
            }
            Console.WriteLine(line.ToString());
            // The session into memory, as a save system keeps it.
            moe_session_save_buffer(s, null, UIntPtr.Zero, out UIntPtr need);
            var save = new byte[(int)need];
            Check(moe_session_save_buffer(s, save, need, out UIntPtr written), "moe_session_save_buffer");
            Console.WriteLine("saved " + written + " bytes");
            return 0;
        }
        catch (Exception e)
        {
            Console.Error.WriteLine(e.Message);
            return 1;
        }
        finally
        {
            moe_session_close(s);
            moe_ctx_close(ctx);
            moe_log_set(null, IntPtr.Zero);
            Marshal.FreeCoTaskMem(path);
        }
    }
}
